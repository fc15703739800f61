#include "tdist/ddp/zero_redundancy_optimizer.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "tdist/comm/distributed.h"
#include "tdist/comm/object_collectives.h"
#include "tdist/detail/util/optimizer_state.h"
#include "tdist/detail/util/torch_compat.h"
#include "tdist/error.h"

// Note [ZeRO overlap_with_ddp]: PyTorch's overlap_with_ddp runs the optimizer step inside
// DDP's communication hook, bucket by bucket, with a *functional* optimizer that takes the
// bucket's gradients as an argument, and delays building the local optimizer until DDP has
// rebuilt its buckets. LibTorch's optimizers have no functional step (step() walks every
// parameter of every group and reads .grad), so stepping only one bucket's parameters would
// mean rebuilding or faking per-bucket optimizers whose state layout differs from a plain
// optimizer's. tdist refuses the option rather than offer an imitation: call step() after
// backward (DDP's all-reduce still overlaps the backward itself).
//
// Note [ZeRO param group options]: ddp sits below tdist::checkpoint, whose
// optimizer_param_groups.h writes options per optimizer type, so the options travel here
// through LibTorch's own OptimizerOptions::serialize: every option any LibTorch optimizer
// (or a user's, if it implements serialize) declares, under its name, which is PyTorch's.
// tdist::optim's maximize and implementation are not LibTorch options: they stay what the
// factory set and are neither written nor read.

namespace tdist::ddp {

namespace detail {

std::vector<std::vector<size_t>> partition_parameter_groups(
    const std::vector<std::vector<int64_t>>& numels_per_group, int world_size) {
  TDIST_CHECK_ARG(world_size > 0, "partition_parameters: world_size must be positive");
  std::vector<int64_t> load(world_size, 0);
  std::vector<std::vector<size_t>> parts(world_size);
  size_t first = 0;
  for (const auto& numels : numels_per_group) {
    std::vector<size_t> order(numels.size());
    std::iota(order.begin(), order.end(), 0);
    // Python's sorted(..., reverse=True) is stable too: equal sizes keep their order.
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return numels[a] > numels[b]; });
    for (auto i : order) {
      const int rank = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      parts[rank].push_back(first + i);
      load[rank] += numels[i];
    }
    first += numels.size();
  }
  for (auto& p : parts) std::sort(p.begin(), p.end());
  return parts;
}

std::vector<std::vector<size_t>> partition_parameters(const std::vector<int64_t>& numels,
                                                      int world_size) {
  return partition_parameter_groups({numels}, world_size);
}

}  // namespace detail

namespace {

using nlohmann::json;
using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamGroup;

std::string zero_shape_str(at::IntArrayRef sizes) {
  std::ostringstream os;
  os << sizes;
  return os.str();
}

/// The options' values by name, as LibTorch's OptimizerOptions::serialize writes them
/// (Note [ZeRO param group options]).
std::vector<std::pair<std::string, c10::IValue>> zero_serialized_options(
    const OptimizerOptions& options) {
  std::ostringstream bytes;
  try {
    torch::serialize::OutputArchive out;
    options.serialize(out);
    out.save_to(bytes);
  } catch (const c10::Error& e) {
    TDIST_THROW(InvalidArgument,
                std::string("ZeroRedundancyOptimizer: the optimizer's options cannot be "
                            "serialized (OptimizerOptions::serialize): ") +
                    e.what_without_backtrace() +
                    "; implement serialize for a custom optimizer's options to save its state");
  }
  std::istringstream in_bytes(bytes.str());
  torch::serialize::InputArchive in;
  in.load_from(in_bytes);
  std::vector<std::pair<std::string, c10::IValue>> values;
  for (const auto& key : in.keys()) {
    if (key == "training") continue;  // the archive's own module flag, not an option
    c10::IValue value;
    in.read(key, value);
    values.emplace_back(key, std::move(value));
  }
  return values;
}

std::set<std::string> zero_option_names(const OptimizerOptions& options) {
  std::set<std::string> names;
  for (const auto& [key, value] : zero_serialized_options(options)) names.insert(key);
  return names;
}

json zero_ivalue_json(const c10::IValue& v, const std::string& what) {
  if (v.isNone()) return nullptr;
  if (v.isBool()) return v.toBool();
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return v.toDouble();
  if (v.isString()) return v.toStringRef();
  if (v.isTuple() || v.isList()) {
    json out = json::array();
    const auto elements = v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec();
    for (const auto& e : elements) out.push_back(zero_ivalue_json(e, what));
    return out;
  }
  TDIST_THROW(InvalidArgument, "ZeroRedundancyOptimizer::state_dict: option '" + what +
                                   "' has a value of type " + v.tagKind() +
                                   ", which a state dict cannot hold");
}

/// `j` as an IValue of `like`'s type; `what` names the option in errors.
c10::IValue zero_json_ivalue(const json& j, const c10::IValue& like, const std::string& what) {
  const auto fail = [&](const std::string& want) {
    TDIST_THROW(InvalidArgument, what + " must be " + want + ", got " + j.dump());
  };
  if (like.isBool() || (like.isNone() && j.is_boolean())) {
    if (!j.is_boolean()) fail("true or false");
    return j.get<bool>();
  }
  if (like.isInt() || (like.isNone() && j.is_number_integer())) {
    if (!j.is_number_integer()) fail("an integer");
    return j.get<int64_t>();
  }
  if (like.isDouble() || (like.isNone() && j.is_number())) {
    if (!j.is_number()) fail("a number");
    return j.get<double>();
  }
  if (like.isString() || (like.isNone() && j.is_string())) {
    if (!j.is_string()) fail("a string");
    return j.get<std::string>();
  }
  if (like.isTuple()) {
    const auto& elements = like.toTupleRef().elements();
    if (!j.is_array() || j.size() != elements.size()) {
      fail("a list of " + std::to_string(elements.size()) + " values");
    }
    std::vector<c10::IValue> out;
    for (size_t k = 0; k < elements.size(); ++k) {
      out.push_back(zero_json_ivalue(j[k], elements[k], what));
    }
    return c10::ivalue::Tuple::create(std::move(out));
  }
  fail(std::string("a value of type ") + like.tagKind());
  return {};
}

json zero_options_json(const OptimizerOptions& options) {
  json g = json::object();
  for (const auto& [key, value] : zero_serialized_options(options)) {
    g[key] = zero_ivalue_json(value, key);
  }
  return g;
}

/// Sets every option `group` has a value for; keys the options lack (Python's foreach,
/// maximize, ...) are ignored, as tdist::checkpoint's set_optimizer_param_groups does.
void zero_set_options(OptimizerOptions& options, const json& group, const std::string& where) {
  torch::serialize::OutputArchive out;
  for (const auto& [key, value] : zero_serialized_options(options)) {
    auto it = group.find(key);
    const bool given = it != group.end() && !it->is_null();
    out.write(key, given ? zero_json_ivalue(*it, value, where + "'s '" + key + "'") : value);
  }
  std::ostringstream bytes;
  out.save_to(bytes);
  std::istringstream in_bytes(bytes.str());
  torch::serialize::InputArchive in;
  in.load_from(in_bytes);
  options.serialize(in);
}

/// The fields the local optimizer's type keeps per parameter, found by creating every field
/// for a scratch tensor that is not one of its parameters, then dropping that state.
std::set<std::string> zero_supported_fields(torch::optim::Optimizer& optimizer) {
  const at::Tensor scratch = at::zeros({1});
  std::set<std::string> names;
  for (const auto& f : util::optimizer_state_fields(optimizer, scratch, scratch,
                                                    util::optimizer_state_field_names())) {
    names.insert(f.name);
  }
  optimizer.state().erase(util::optimizer_state_key(scratch));
  return names;
}

/// Groups a partition's indices by (device, dtype), in order of first appearance (the same
/// on every rank, whose parameters match): one broadcast each.
std::vector<ZeroParamBucket> zero_layout(const std::vector<at::Tensor>& params,
                                         const std::vector<std::vector<size_t>>& partitions) {
  std::vector<ZeroParamBucket> out;
  for (int r = 0; r < static_cast<int>(partitions.size()); ++r) {
    std::vector<std::pair<c10::Device, at::ScalarType>> keys;
    const size_t begin = out.size();
    for (auto i : partitions[r]) {
      const std::pair<c10::Device, at::ScalarType> key(params[i].device(), params[i].scalar_type());
      auto it = std::find(keys.begin(), keys.end(), key);
      if (it == keys.end()) {
        keys.push_back(key);
        out.push_back(ZeroParamBucket{r, {}, {}});
        it = keys.end() - 1;
      }
      out[begin + (it - keys.begin())].indices.push_back(i);
    }
  }
  return out;
}

}  // namespace

/// Join hook of ZeroRedundancyOptimizer: a joined rank keeps its partition in step.
class ZeroJoinHook : public join::JoinHook {
 public:
  explicit ZeroJoinHook(ZeroRedundancyOptimizer* zero) : zero_(zero) {}
  // Not step(): a joined rank must not notify the join context again.
  void main_hook() override { zero_->step_local_and_sync(); }

 private:
  ZeroRedundancyOptimizer* zero_;
};

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> params,
                                                 const OptimizerFactory& factory,
                                                 ZeroRedundancyOptimizerOptions options)
    : ZeroRedundancyOptimizer(
          std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))}, factory,
          std::move(options)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(
    const std::vector<OptimizerParamGroup>& param_groups, const OptimizerFactory& factory,
    ZeroRedundancyOptimizerOptions options)
    : bucket_view_(options.parameters_as_bucket_view()) {
  TDIST_CHECK_ARG(!options.overlap_with_ddp(),
                  "ZeroRedundancyOptimizer: overlap_with_ddp is not provided by tdist "
                  "(LibTorch's optimizers have no per-bucket functional step to run inside "
                  "DDP's communication hook); leave it false and call step() after backward");
  TDIST_CHECK_ARG(static_cast<bool>(factory), "ZeroRedundancyOptimizer: the factory is empty");
  group_ = options.process_group() ? options.process_group() : group_world();
  TDIST_CHECK_ARG(group_->is_member(),
                  "ZeroRedundancyOptimizer: this rank is not a member of the process group");
  std::vector<at::Tensor> all;
  for (const auto& g : param_groups) all.insert(all.end(), g.params().begin(), g.params().end());
  TDIST_CHECK_ARG(!all.empty(), "ZeroRedundancyOptimizer: no parameters given");
  check_new_parameters(all, "ZeroRedundancyOptimizer");
  for (const auto& g : param_groups) {
    std::vector<size_t> indices;
    for (const auto& p : g.params()) {
      indices.push_back(params_.size());
      params_.push_back(p);
    }
    groups_.push_back(std::move(indices));
  }
  partition();
  local_ = factory(local_groups(param_groups));
  TDIST_CHECK_ARG(local_ != nullptr, "ZeroRedundancyOptimizer: the factory returned null");
  TDIST_CHECK_ARG(local_->param_groups().size() == groups_.size(),
                  "ZeroRedundancyOptimizer: the factory built an optimizer with " +
                      std::to_string(local_->param_groups().size()) + " param groups from " +
                      std::to_string(groups_.size()) +
                      "; build it over the param groups the factory is given");
  const auto names = zero_option_names(local_->defaults());
  for (size_t g = 0; g < param_groups.size(); ++g) {
    TDIST_CHECK_ARG(
        !param_groups[g].has_options() || zero_option_names(param_groups[g].options()) == names,
        "ZeroRedundancyOptimizer: param group " + std::to_string(g) +
            " has options of another optimizer type than the factory's; give it "
            "the local optimizer's options type");
  }
  build_buckets();
}

std::vector<OptimizerParamGroup> ZeroRedundancyOptimizer::local_groups(
    const std::vector<OptimizerParamGroup>& groups) const {
  std::vector<OptimizerParamGroup> out;
  const int rank = group_->rank();
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<at::Tensor> mine;
    for (auto i : groups_[g]) {
      if (owner_[i] == rank) mine.push_back(params_[i]);
    }
    if (groups[g].has_options()) {
      out.emplace_back(std::move(mine), groups[g].options().clone());
    } else {
      out.emplace_back(std::move(mine));
    }
  }
  return out;
}

void ZeroRedundancyOptimizer::check_new_parameters(const std::vector<at::Tensor>& params,
                                                   const char* op) const {
  std::map<const c10::TensorImpl*, size_t> seen;
  for (size_t i = 0; i < params_.size(); ++i) seen.emplace(params_[i].unsafeGetTensorImpl(), i);
  const std::string who = std::string(op) + " on group rank " + std::to_string(group_->rank());
  for (size_t k = 0; k < params.size(); ++k) {
    const auto& p = params[k];
    const std::string which = who + ": parameter " + std::to_string(k);
    TDIST_CHECK_ARG(p.defined(), which + " is undefined; pass defined tensors");
    TDIST_CHECK_ARG(p.is_leaf(), which +
                                     " is not a leaf tensor (it was computed from others); "
                                     "optimize the leaf parameters themselves");
    TDIST_CHECK_ARG(p.layout() == at::kStrided,
                    which + " is sparse; ZeroRedundancyOptimizer takes dense parameters only");
    auto [it, fresh] = seen.emplace(p.unsafeGetTensorImpl(), params_.size() + k);
    TDIST_CHECK_ARG(fresh, which + " is already parameter " + std::to_string(it->second) +
                               " of this optimizer; a parameter can be in one group only");
  }
  if (group_->size() == 1) return;
  // Every rank partitions alike only if every rank has the same parameters: compare shapes
  // and dtypes across ranks before anything depends on them, so a mismatch fails everywhere
  // instead of hanging.
  Object::List mine;
  for (const auto& p : params) {
    mine.emplace_back(zero_shape_str(p.sizes()) + " " +
                      std::string(c10::toString(p.scalar_type())));
  }
  std::vector<Object> all;
  all_gather_object(all, Object(mine), group_);
  const auto& ref = all[0].as_list();
  for (int r = 1; r < group_->size(); ++r) {
    const auto& theirs = all[r].as_list();
    if (theirs.size() != ref.size()) {
      TDIST_THROW(InvalidArgument, who + ": group rank " + std::to_string(r) + " passed " +
                                       std::to_string(theirs.size()) + " parameters, rank 0 " +
                                       std::to_string(ref.size()) +
                                       "; every rank must pass the same parameters");
    }
    for (size_t k = 0; k < ref.size(); ++k) {
      if (theirs[k] != ref[k]) {
        TDIST_THROW(InvalidArgument,
                    who + ": parameter " + std::to_string(k) + " is " + theirs[k].as_string() +
                        " on group rank " + std::to_string(r) + " but " + ref[k].as_string() +
                        " on rank 0; every rank must pass the same parameters in the same order");
      }
    }
  }
}

void ZeroRedundancyOptimizer::partition() {
  std::vector<std::vector<int64_t>> numels;
  for (const auto& g : groups_) {
    numels.emplace_back();
    for (auto i : g) numels.back().push_back(params_[i].numel());
  }
  partitions_ = detail::partition_parameter_groups(numels, group_->size());
  owner_.assign(params_.size(), -1);
  for (int r = 0; r < group_->size(); ++r) {
    for (auto i : partitions_[r]) owner_[i] = r;
  }
}

void ZeroRedundancyOptimizer::build_buckets() {
  if (!bucket_view_) return;
  at::NoGradGuard no_grad;
  buckets_ = zero_layout(params_, partitions_);
  for (auto& b : buckets_) {
    int64_t n = 0;
    for (auto i : b.indices) n += params_[i].numel();
    const auto& first = params_[b.indices.front()];
    b.buffer = at::empty({n}, first.options().requires_grad(false));
    int64_t offset = 0;
    for (auto i : b.indices) {
      auto& p = params_[i];
      at::Tensor view = b.buffer.narrow(0, offset, p.numel());
      view.copy_(p.detach().reshape({-1}));
      // The parameter keeps its identity (module, autograd, optimizer state); only its
      // storage moves into the bucket. Rebuilding (add_param_group) moves it again.
      p.set_data(view.view(p.sizes()));
      offset += p.numel();
    }
  }
}

void ZeroRedundancyOptimizer::step() {
  join::Join::notify_join_context(*this);
  step_local_and_sync();
}

void ZeroRedundancyOptimizer::step_local_and_sync() {
  local_->step();
  sync_params();
}

void ZeroRedundancyOptimizer::sync_params() {
  if (group_->size() == 1) return;
  at::NoGradGuard no_grad;
  if (bucket_view_) {
    std::vector<WorkPtr> works;
    for (auto& b : buckets_) {
      works.push_back(broadcast(b.buffer, group_->global_rank(b.rank), group_, /*async_op=*/true));
    }
    for (auto& w : works) w->wait(group_->timeout());
    return;
  }
  // One broadcast per (owner, device, dtype), packed and unpacked around it.
  auto flats = zero_layout(params_, partitions_);
  std::vector<WorkPtr> works;
  for (auto& flat : flats) {
    if (flat.rank == group_->rank()) {
      std::vector<at::Tensor> parts;
      for (auto i : flat.indices) parts.push_back(params_[i].detach().reshape({-1}));
      flat.buffer = at::cat(parts);
    } else {
      int64_t n = 0;
      for (auto i : flat.indices) n += params_[i].numel();
      flat.buffer = at::empty({n}, params_[flat.indices[0]].options().requires_grad(false));
    }
    works.push_back(
        broadcast(flat.buffer, group_->global_rank(flat.rank), group_, /*async_op=*/true));
  }
  for (auto& w : works) w->wait(group_->timeout());
  for (auto& flat : flats) {
    if (flat.rank == group_->rank()) continue;
    int64_t offset = 0;
    for (auto i : flat.indices) {
      auto& p = params_[i];
      p.detach().copy_(flat.buffer.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  for (auto& p : params_) {
    at::Tensor& grad = p.mutable_grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      grad = at::Tensor();
    } else {
      grad = grad.detach();
      grad.zero_();
    }
  }
}

void ZeroRedundancyOptimizer::add_param_group(const OptimizerParamGroup& param_group) {
  const char* op = "ZeroRedundancyOptimizer::add_param_group";
  if (param_group.has_options()) {
    TDIST_CHECK_ARG(
        zero_option_names(param_group.options()) == zero_option_names(local_->defaults()),
        std::string(op) +
            ": the group's options are of another optimizer type than the "
            "factory's; give it the local optimizer's options type");
  }
  check_new_parameters(param_group.params(), op);
  const std::vector<int> before = owner_;
  std::vector<size_t> indices;
  for (const auto& p : param_group.params()) {
    indices.push_back(params_.size());
    params_.push_back(p);
  }
  groups_.push_back(std::move(indices));
  partition();
  TDIST_CHECK_ARG(std::equal(before.begin(), before.end(), owner_.begin()),
                  std::string(op) + ": internal error: re-partitioning moved a parameter");
  std::vector<at::Tensor> mine;
  for (auto i : groups_.back()) {
    if (owner_[i] == group_->rank()) mine.push_back(params_[i]);
  }
  if (param_group.has_options()) {
    local_->add_param_group(OptimizerParamGroup(std::move(mine), param_group.options().clone()));
  } else {
    local_->add_param_group(OptimizerParamGroup(std::move(mine)));
  }
  build_buckets();
  consolidated_.reset();
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const int size = group_->size(), rank = group_->rank();
  TDIST_CHECK_ARG(to >= 0 && to < size,
                  "ZeroRedundancyOptimizer::consolidate_state_dict on group rank " +
                      std::to_string(rank) + ": to=" + std::to_string(to) +
                      " is not a rank of the process group (0.." + std::to_string(size - 1) +
                      "); pass a group rank, the same on every rank");
  Object::Dict mine;
  for (auto i : partitions_[rank]) {
    for (const auto& f : util::optimizer_state_fields(*local_, params_[i], params_[i])) {
      mine[std::to_string(i) + "." + f.name] = f.tensor.detach().to(at::kCPU).clone();
    }
  }
  consolidated_.reset();
  std::vector<Object> gathered;
  if (size == 1) {
    gathered.emplace_back(std::move(mine));
  } else {
    gather_object(Object(std::move(mine)), rank == to ? &gathered : nullptr, std::nullopt, group_,
                  to);
  }
  if (rank != to) return;
  ShardedStateDict state;
  for (const auto& from : gathered) {
    for (const auto& [key, value] : from.as_dict()) {
      state[key] = ShardedTensor::whole(value.as_tensor());
    }
  }
  consolidated_ = std::move(state);
}

ZeroStateDict ZeroRedundancyOptimizer::state_dict() const {
  const std::string rank = std::to_string(group_->rank());
  TDIST_CHECK_ARG(consolidated_.has_value(),
                  "ZeroRedundancyOptimizer::state_dict on group rank " + rank +
                      ": the optimizer state has not been consolidated on this rank; call "
                      "consolidate_state_dict(" +
                      rank + ") on all ranks first");
  ZeroStateDict out;
  out.state = *consolidated_;
  for (size_t g = 0; g < groups_.size(); ++g) {
    json group = zero_options_json(local_->param_groups()[g].options());
    group["params"] = groups_[g];
    out.param_groups.push_back(std::move(group));
  }
  return out;
}

void ZeroRedundancyOptimizer::load_state_dict(const ZeroStateDict& state_dict) {
  const std::string op =
      "ZeroRedundancyOptimizer::load_state_dict on group rank " + std::to_string(group_->rank());
  const json& groups = state_dict.param_groups;
  TDIST_CHECK_ARG(groups.is_array(), op + ": param_groups must be a list, got " + groups.dump());
  TDIST_CHECK_ARG(groups.size() == groups_.size(),
                  op + ": the state dict has " + std::to_string(groups.size()) +
                      " param groups, this optimizer " + std::to_string(groups_.size()) +
                      "; build it with the same param groups (add_param_group) before loading");
  // As PyTorch's Optimizer.load_state_dict: the saved groups' parameter ids map, position by
  // position, to this optimizer's parameters.
  std::map<int64_t, size_t> index_of;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const json& group = groups[g];
    const std::string where = op + ": param group " + std::to_string(g);
    TDIST_CHECK_ARG(group.is_object() && group.contains("params") && group["params"].is_array(),
                    where + " must be an object with a 'params' list, got " + group.dump());
    const json& ids = group["params"];
    TDIST_CHECK_ARG(ids.size() == groups_[g].size(),
                    where + " has " + std::to_string(ids.size()) + " parameters in the state " +
                        "dict and " + std::to_string(groups_[g].size()) +
                        " here; load a state dict saved from the same parameters");
    for (size_t k = 0; k < ids.size(); ++k) {
      TDIST_CHECK_ARG(ids[k].is_number_integer(),
                      where + "'s params must be parameter indices, got " + ids[k].dump());
      TDIST_CHECK_ARG(index_of.emplace(ids[k].get<int64_t>(), groups_[g][k]).second,
                      where + " lists parameter index " + ids[k].dump() + " twice");
    }
    auto scratch = local_->param_groups()[g].options().clone();
    zero_set_options(*scratch, group, where);  // type errors now, before anything changes
  }
  const auto supported = zero_supported_fields(*local_);
  std::map<size_t, std::map<std::string, at::Tensor>> saved;
  for (const auto& [key, entry] : state_dict.state) {
    const auto dot = key.find('.');
    int64_t id = -1;
    size_t used = 0;
    try {
      id = std::stoll(key.substr(0, dot), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TDIST_CHECK_ARG(dot != std::string::npos && used == dot,
                    op + ": state key '" + key + "' is not '<parameter index>.<field>'");
    const std::string field = key.substr(dot + 1);
    auto it = index_of.find(id);
    TDIST_CHECK_ARG(it != index_of.end(), op + ": state '" + key + "' is for parameter index " +
                                              std::to_string(id) +
                                              ", which no param group of the state dict lists");
    TDIST_CHECK_ARG(supported.count(field) > 0,
                    op + ": state '" + key + "' names field '" + field +
                        "', which this optimizer does not keep; load a state dict saved with "
                        "the same optimizer type");
    const at::Tensor& t = entry.local;
    const at::Tensor& p = params_[it->second];
    TDIST_CHECK_ARG(t.defined() && t.sizes().vec() == entry.global_shape,
                    op + ": state '" + key + "' must be a whole tensor");
    if (field == "step") {
      TDIST_CHECK_ARG(t.numel() == 1, op + ": state '" + key + "' must be one number, has shape " +
                                          zero_shape_str(t.sizes()));
    } else {
      TDIST_CHECK_ARG(t.sizes() == p.sizes(),
                      op + ": state '" + key + "' has shape " + zero_shape_str(t.sizes()) +
                          ", parameter " + std::to_string(it->second) + " has shape " +
                          zero_shape_str(p.sizes()) +
                          "; load a state dict saved from the same model (same parameters in "
                          "the same order)");
    }
    saved[it->second][field] = t;
  }

  at::NoGradGuard no_grad;
  for (auto i : partitions_[group_->rank()]) {
    const at::Tensor& p = params_[i];
    // PyTorch replaces the state: what the state dict does not have starts afresh.
    local_->state().erase(util::optimizer_state_key(p));
    auto it = saved.find(i);
    if (it == saved.end()) continue;
    std::set<std::string> create;
    for (const auto& [field, t] : it->second) create.insert(field);
    for (auto& f : util::optimizer_state_fields(*local_, p, p.detach(), create)) {
      auto value = it->second.find(f.name);
      if (value == it->second.end()) continue;
      if (f.is_step) {
        f.set_step(value->second.item<int64_t>());
      } else {
        f.tensor.copy_(value->second);
      }
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    zero_set_options(local_->param_groups()[g].options(), groups[g],
                     op + ": param group " + std::to_string(g));
  }
  consolidated_.reset();
}

std::unique_ptr<join::JoinHook> ZeroRedundancyOptimizer::join_hook(
    const join::JoinKwargs& /*kwargs*/) {
  return std::make_unique<ZeroJoinHook>(this);
}

c10::Device ZeroRedundancyOptimizer::join_device() const {
  return params_.front().device();
}

}  // namespace tdist::ddp

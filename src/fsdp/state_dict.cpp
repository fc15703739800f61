// Model and optimizer state dicts of FSDP (and plain) modules; see state_dict.h.
//
// Note [State dict entries]
// The entries are every parameter and buffer of the module, named by the module tree
// (named_parameters()/named_buffers()), so the names are those of the unsharded model. A
// parameter that a fully_shard call under the module manages is found by identity (its
// TensorImpl, Note [Parameter identity]) among the ShardedParams of the FSDP states of the
// module and its descendants; its data is the ShardedParam's local shard (what P holds at
// rest, in the sharded dtype even under mixed precision). Everything else (buffers, ignored
// parameters) is whole on every rank. Optimizer state is shaped like the parameter's local
// data, so it is sliced the same way.

#include "tdist/fsdp/state_dict.h"

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/optim.h>

#include "fsdp/collectives.h"
#include "fsdp/fsdp_state.h"
#include "fsdp/param_group.h"
#include "fsdp/registry.h"
#include "fsdp/sharded_param.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/object_collectives.h"
#include "tdist/detail/util/optimizer_state.h"
#include "tdist/detail/util/text.h"
#include "tdist/detail/util/torch_compat.h"
#include "tdist/error.h"
#include "tdist/tensor/dtensor.h"
#include "tdist/tensor/parallel/parallelize.h"

namespace tdist::fsdp {
namespace detail {
namespace {

// ---- the module's entries (Note [State dict entries]) -------------------------------------

struct Entry {
  at::Tensor tensor;                      // the parameter or buffer itself
  const ShardedParam* sharded = nullptr;  // set when FSDP shards it
  bool frozen = false;                    // a parameter with requires_grad = false
  ParamGroup* group = nullptr;            // the group communicating it
  // Set when tensor parallelism distributed it: what FSDP (or nobody) shards is then this
  // rank's tensor-parallel part, itself a slice of the whole tensor.
  std::optional<tensor::parallel::ParameterPlacement> tensor_parallel;

  /// This rank's data: the local shard, or the whole tensor.
  at::Tensor local() const { return sharded ? sharded->local_shard() : tensor.detach(); }
};

struct ModuleEntries {
  std::map<std::string, Entry> entries;  // parameters and buffers by name
  std::unordered_map<const c10::TensorImpl*, std::string> param_names;
  std::vector<ParamGroup*> groups;
};

ModuleEntries collect_module_entries(const torch::nn::Module& module) {
  ModuleEntries out;
  std::unordered_map<const c10::TensorImpl*, std::pair<const ShardedParam*, ParamGroup*>> managed;
  auto visit = [&](const torch::nn::Module& m) {
    FSDPState* state = find_state(m);
    if (state == nullptr || state->group() == nullptr) return;
    const auto& groups = out.groups;  // modules sharded together share one group: once
    if (std::find(groups.begin(), groups.end(), state->group()) != groups.end()) return;
    out.groups.push_back(state->group());
    for (const auto& sp : state->group()->params()) {
      managed[sp->param().unsafeGetTensorImpl()] = {sp.get(), state->group()};
    }
  };
  visit(module);
  for (const auto& child : module.modules(/*include_self=*/false)) visit(*child);

  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    Entry e;
    e.tensor = item.value();
    auto it = managed.find(e.tensor.unsafeGetTensorImpl());
    if (it != managed.end()) {
      e.sharded = it->second.first;
      e.group = it->second.second;
    }
    e.frozen = !e.tensor.requires_grad();
    e.tensor_parallel = tensor::parallel::parameter_placement(e.tensor);
    out.param_names.emplace(e.tensor.unsafeGetTensorImpl(), item.key());
    out.entries[item.key()] = e;
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    Entry e;
    e.tensor = item.value();
    out.entries[item.key()] = e;
  }
  return out;
}

bool distributed() {
  return is_initialized() && get_world_size() > 1;
}

int global_rank() {
  return is_initialized() ? get_rank() : 0;
}

std::string on_rank() {
  return " on rank " + std::to_string(global_rank());
}

/// Writing needs every group idle and resharded (a root left unsharded by a forward-only
/// call would otherwise keep computing with stale unsharded data).
void prepare_for_write(const ModuleEntries& me, const char* op) {
  for (ParamGroup* g : me.groups) {
    if (g->training_state() != TrainingState::kIdle || g->shard_state() == ShardState::kSummoned) {
      TDIST_THROW(InvalidArgument, std::string(op) + on_rank() + ": module '" + g->label() +
                                       "' is in training state " + to_string(g->training_state()) +
                                       ", shard state " + to_string(g->shard_state()) +
                                       "; load state dicts between steps, outside forward/"
                                       "backward and summon_full_params");
    }
    g->reshard();
  }
}

/// The slice of a sharded entry's local data (nullopt: a 0-dim tensor this rank does not own).
std::optional<ShardedTensor> slice_of(const at::Tensor& local, const ShardLayout& layout) {
  if (layout.shape.empty()) {
    if (layout.local_rows == 0) return std::nullopt;
    // Not view({}): braces select Tensor::view(ScalarType), value-initialised to kByte, which
    // reinterprets the scalar's bytes as a uint8 vector.
    return ShardedTensor::whole(local.reshape(at::IntArrayRef{}));
  }
  std::vector<int64_t> offsets(layout.shape.size(), 0);
  offsets[layout.shard_dim] = layout.row_offset;
  return ShardedTensor{local, layout.shape, offsets};
}

/// Note [Tensor-parallel slices]: a tensor-parallel parameter's slice in whole-tensor
/// coordinates: its part's offset (compute_local_shape_and_global_offset), plus FSDP's rows
/// within that part. Checkpoints hold these, so they reshard across (dp, tp) layouts.
ShardedTensor in_whole_tensor(ShardedTensor slice, const Entry& e) {
  if (!e.tensor_parallel) return slice;
  const auto& tp = *e.tensor_parallel;
  const auto [part_shape, part_offset] =
      tensor::compute_local_shape_and_global_offset(tp.global_shape, tp.mesh, tp.placements);
  (void)part_shape;
  std::vector<int64_t> offsets = part_offset;
  for (size_t d = 0; d < offsets.size() && d < slice.offsets.size(); ++d) {
    offsets[d] += slice.offsets[d];
  }
  return ShardedTensor{slice.local, tp.global_shape, offsets};
}

void refuse_full_with_tensor_parallel(const Entry& e, const std::string& name) {
  TDIST_CHECK_ARG(!e.tensor_parallel,
                  "full state dicts of tensor-parallel parameters ('" + name +
                      "') are not provided; use the sharded state dict (the default), which "
                      "tdist::checkpoint reshards to any layout");
}

/// The whole tensor sliced like `sp`, gathered over the shard group, padding bytes dropped.
at::Tensor gather_full(const at::Tensor& local, const ShardedParam& sp, ParamGroup* group) {
  const ShardLayout& l = sp.layout();
  at::Tensor full = all_gather_whole(local, sp, group->shard_group());
  return l.padded_rows() == l.dim0 ? full : full.clone();
}

/// A full-state-dict value: a copy, on the CPU with cpu_offload.
at::Tensor full_value(const at::Tensor& t, bool gathered, const StateDictOptions& options) {
  if (options.cpu_offload()) {
    return t.detach().to(at::TensorOptions().device(at::kCPU), false, /*copy=*/!gathered);
  }
  return gathered ? t : t.detach().clone();
}

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

/// Copies `src` (whole when `full`, else this rank's slice) into `target`, this rank's data
/// of an entry (the local shard or the whole tensor). Throws naming `key` on a mismatch.
void write_value(const std::string& key, const at::Tensor& target, const Entry& e,
                 const ShardedTensor& src, bool full) {
  auto fail = [&](const std::string& why) {
    TDIST_THROW(InvalidArgument, "set state dict" + on_rank() + ": '" + key + "': " + why);
  };
  if (!src.local.defined()) fail("undefined tensor");
  if (e.tensor_parallel && full) refuse_full_with_tensor_parallel(e, key);
  if (e.sharded == nullptr && e.tensor_parallel) {
    const ShardedTensor expected = in_whole_tensor(ShardedTensor::whole(target), e);
    if (src.global_shape != expected.global_shape || src.offsets != expected.offsets ||
        src.local.sizes() != target.sizes()) {
      fail("expected this rank's tensor-parallel part " + shape_str(target.sizes()) +
           " at offsets " + shape_str(expected.offsets) + " of " +
           shape_str(expected.global_shape) + ", got " + shape_str(src.local.sizes()) + " at " +
           shape_str(src.offsets) + " of " + shape_str(src.global_shape));
    }
    target.copy_(src.local);
    return;
  }
  if (e.sharded == nullptr) {
    // Full state dicts: only the tensor itself counts; sharded ones must say it is whole.
    const bool whole = src.local.sizes() == target.sizes() &&
                       (full || (src.global_shape == target.sizes().vec() &&
                                 std::all_of(src.offsets.begin(), src.offsets.end(),
                                             [](int64_t o) { return o == 0; })));
    if (!whole) {
      fail("expected the whole tensor of shape " + shape_str(target.sizes()) + ", got a slice " +
           shape_str(src.local.sizes()) + " of " + shape_str(src.global_shape));
    }
    target.copy_(src.local);
    return;
  }
  const ShardLayout& l = e.sharded->layout();
  if (full) {
    if (src.local.sizes().vec() != l.shape) {
      fail("expected the full tensor of shape " + shape_str(l.shape) + ", got " +
           shape_str(src.local.sizes()));
    }
    if (l.local_rows > 0) {
      // This rank's slice along the shard dim (a scalar is one row of one element).
      const at::Tensor whole = l.shape.empty() ? src.local.reshape({1}) : src.local;
      target.copy_(whole.narrow(l.shard_dim, l.row_offset, l.local_rows));
    }
    return;
  }
  auto expected = slice_of(target, l);
  if (!expected) return;  // a 0-dim tensor owned by another rank
  expected = in_whole_tensor(*expected, e);
  if (src.global_shape != expected->global_shape || src.offsets != expected->offsets ||
      src.local.sizes() != expected->local.sizes()) {
    fail("expected this rank's slice " + shape_str(expected->local.sizes()) + " at offsets " +
         shape_str(expected->offsets) + " of " + shape_str(l.shape) + ", got " +
         shape_str(src.local.sizes()) + " at " + shape_str(src.offsets) + " of " +
         shape_str(src.global_shape) +
         "; a sharded state dict loads only at the sharding it was taken with (reshard "
         "through tdist::checkpoint)");
  }
  expected->local.copy_(src.local);
}

/// As PyTorch's _verify_options, on every rank alike (so no rank is left in a collective).
void check_options(const StateDictOptions& options, const char* op) {
  if (options.broadcast_from_rank0() && !options.full_state_dict()) {
    TDIST_THROW(InvalidArgument, std::string(op) + on_rank() +
                                     ": broadcast_from_rank0 needs full_state_dict(true) (rank "
                                     "0's whole tensors are broadcast; a sharded state dict is "
                                     "already local to each rank)");
  }
}

/// Whether a full state dict's entries are returned on this rank: PyTorch keeps one host copy
/// per job, so with cpu_offload only global rank 0 returns them.
bool keeps_full_entries(const StateDictOptions& options) {
  return !options.cpu_offload() || global_rank() == 0;
}

/// Rank 0's full state dict, broadcast to every rank (broadcast_from_rank0). Every rank
/// returns the same dict.
ShardedStateDict broadcast_rank0_state(const ShardedStateDict& state) {
  std::vector<Object> header(1);
  if (global_rank() == 0) {
    Object::List entries;
    for (const auto& [name, st] : state) {
      if (!st.local.defined()) continue;
      Object::List shape;
      for (int64_t d : st.local.sizes()) shape.emplace_back(d);
      entries.emplace_back(Object::Dict{{"name", name},
                                        {"dtype", static_cast<int64_t>(st.local.scalar_type())},
                                        {"shape", Object(shape)}});
    }
    header[0] = Object(entries);
  }
  broadcast_object_list(header, 0);
  ShardedStateDict out;
  for (const auto& entry : header[0].as_list()) {
    std::vector<int64_t> shape;
    for (const auto& d : entry.at("shape").as_list()) shape.push_back(d.as_int());
    const auto dtype = static_cast<at::ScalarType>(entry.at("dtype").as_int());
    const std::string& name = entry.at("name").as_string();
    at::Tensor t;
    if (global_rank() == 0) {
      t = state.at(name).local.detach().to(at::kCPU, dtype).contiguous();
    } else {
      t = at::empty(shape, at::TensorOptions().dtype(dtype));
    }
    if (t.numel() > 0) {
      at::Tensor on = to_collective_device(t);
      broadcast(on, 0);
      t = on.cpu();
    }
    out[name] = ShardedTensor::whole(t);
  }
  return out;
}

/// The state a set_*_state_dict call loads: `state` itself, or, with broadcast_from_rank0 in a
/// distributed run, rank 0's state broadcast into `received` (other ranks pass what they have,
/// usually nothing).
const ShardedStateDict& state_to_load(const ShardedStateDict& state,
                                      const StateDictOptions& options, ShardedStateDict& received) {
  if (!options.broadcast_from_rank0() || !distributed()) return state;
  received = broadcast_rank0_state(state);
  return received;
}

/// The optimizer (index into `optimizers`) holding each parameter, by the module's name for
/// it; a parameter held by two of them is refused (their state dicts would collide).
std::map<std::string, size_t> optimizer_of_params(
    const torch::nn::Module& module, const std::vector<torch::optim::Optimizer*>& optimizers,
    const char* op) {
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  std::map<std::string, size_t> out;
  for (size_t i = 0; i < optimizers.size(); ++i) {
    TDIST_CHECK_ARG(optimizers[i] != nullptr, std::string(op) + on_rank() + ": optimizers[" +
                                                  std::to_string(i) + "] is null");
    for (const auto& group : optimizers[i]->param_groups()) {
      for (const auto& p : group.params()) {
        auto name = names.find(p.unsafeGetTensorImpl());
        TDIST_CHECK_ARG(name != names.end(),
                        std::string(op) + on_rank() + ": optimizers[" + std::to_string(i) +
                            "] holds a parameter the module does not have; pass the module "
                            "the optimizers were built from");
        const auto [it, inserted] = out.emplace(name->second, i);
        if (!inserted && it->second != i) {
          TDIST_THROW(InvalidArgument, std::string(op) + on_rank() + ": parameter '" +
                                           name->second + "' is held by optimizers[" +
                                           std::to_string(it->second) + "] and optimizers[" +
                                           std::to_string(i) +
                                           "]; give each parameter to one optimizer");
        }
      }
    }
  }
  return out;
}

/// The optimizer's fields by key "<fqn>.<field>", with the entry of their parameter.
struct OptimizerItem {
  util::OptimizerStateField field;
  const Entry* entry;
};

std::map<std::string, OptimizerItem> optimizer_items(torch::optim::Optimizer& optimizer,
                                                     const ModuleEntries& me) {
  std::map<std::string, OptimizerItem> out;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      auto name = me.param_names.find(p.unsafeGetTensorImpl());
      TDIST_CHECK_ARG(name != me.param_names.end(),
                      "get_optimizer_state_dict" + on_rank() +
                          ": the optimizer holds a parameter the module does not have; pass "
                          "the module the optimizer was built from");
      const Entry& e = me.entries.at(name->second);
      for (auto& f : util::optimizer_state_fields(optimizer, p, e.local())) {
        if (!f.is_step && f.tensor.sizes() != e.local().sizes()) {
          TDIST_THROW(InvalidArgument, "get_optimizer_state_dict" + on_rank() + ": state '" +
                                           f.name + "' of '" + name->second + "' has shape " +
                                           shape_str(f.tensor.sizes()) + ", not the parameter's " +
                                           shape_str(e.local().sizes()));
        }
        out.emplace(name->second + "." + f.name, OptimizerItem{f, &e});
      }
    }
  }
  return out;
}

/// Full optimizer state dicts gather key by key; check every rank of each shard group has
/// the same keys first (else the gathers would pair up wrong or hang).
void agree_on_keys(const std::map<std::string, OptimizerItem>& items, const ModuleEntries& me) {
  if (me.groups.empty() || me.groups.front()->shard_group() == nullptr ||
      me.groups.front()->shard_group()->size() == 1) {
    return;
  }
  std::string keys;
  for (const auto& [key, item] : items) keys += key + "\n";
  std::vector<Object> all;
  all_gather_object(all, Object(keys), me.groups.front()->shard_group());
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].as_string() != keys) {
      TDIST_THROW(InvalidArgument,
                  "get_optimizer_state_dict" + on_rank() +
                      ": the ranks of the shard group hold state for different parameters "
                      "(shard-group rank " +
                      std::to_string(r) +
                      " differs); step the optimizer on every rank before taking a full state "
                      "dict");
    }
  }
}

}  // namespace

void prepare_to_load(const torch::nn::Module& module) {
  prepare_for_write(collect_module_entries(module), "load into a sharded state dict");
}

}  // namespace detail

// ---- public API ------------------------------------------------------------------------------

ShardedStateDict get_model_state_dict(const torch::nn::Module& module,
                                      const StateDictOptions& options) {
  detail::check_options(options, "get_model_state_dict");
  const detail::ModuleEntries me = detail::collect_module_entries(module);
  ShardedStateDict out;
  const bool keep = detail::keeps_full_entries(options);
  for (const auto& [name, e] : me.entries) {
    if (e.frozen && options.ignore_frozen_params()) continue;  // the same on every rank
    if (!options.full_state_dict()) {
      if (e.sharded == nullptr) {
        out[name] = detail::in_whole_tensor(ShardedTensor::whole(e.local()), e);
      } else if (auto slice = detail::slice_of(e.local(), e.sharded->layout())) {
        out[name] = detail::in_whole_tensor(*slice, e);
      }
      continue;
    }
    detail::refuse_full_with_tensor_parallel(e, name);
    if (e.sharded != nullptr) {
      at::Tensor full = detail::gather_full(e.local(), *e.sharded, e.group);  // collective
      if (keep) out[name] = ShardedTensor::whole(detail::full_value(full, true, options));
    } else if (keep) {
      out[name] = ShardedTensor::whole(detail::full_value(e.local(), false, options));
    }
  }
  return out;
}

IncompatibleKeys set_model_state_dict(torch::nn::Module& module, const ShardedStateDict& state,
                                      const StateDictOptions& options) {
  detail::check_options(options, "set_model_state_dict");
  const detail::ModuleEntries me = detail::collect_module_entries(module);
  detail::prepare_for_write(me, "set_model_state_dict");
  const bool full = options.full_state_dict();
  ShardedStateDict received;
  const ShardedStateDict& src = detail::state_to_load(state, options, received);
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, e] : me.entries) {
    const bool expected = full || e.sharded == nullptr || !e.sharded->layout().shape.empty() ||
                          e.sharded->layout().local_rows > 0;
    if (expected && src.count(name) == 0) missing.push_back(name);
  }
  for (const auto& [name, st] : src) {
    if (me.entries.count(name) == 0) unexpected.push_back(name);
  }
  if (options.strict() && (!missing.empty() || !unexpected.empty())) {
    TDIST_THROW(InvalidArgument, "set_model_state_dict" + detail::on_rank() +
                                     ": the state dict does not match the module. missing: [" +
                                     util::join(missing) + "] unexpected: [" +
                                     util::join(unexpected) +
                                     "]; pass strict(false) to load what matches");
  }
  c10::AutoGradMode no_grad(false);
  for (const auto& [name, e] : me.entries) {
    auto it = src.find(name);
    if (it == src.end()) continue;
    detail::write_value(name, e.local(), e, it->second, full);
  }
  return IncompatibleKeys{std::move(missing), std::move(unexpected)};
}

ShardedStateDict get_optimizer_state_dict(const torch::nn::Module& module,
                                          torch::optim::Optimizer& optimizer,
                                          const StateDictOptions& options) {
  detail::check_options(options, "get_optimizer_state_dict");
  const detail::ModuleEntries me = detail::collect_module_entries(module);
  const auto items = detail::optimizer_items(optimizer, me);
  ShardedStateDict out;
  if (!options.full_state_dict()) {
    for (const auto& [key, item] : items) {
      const detail::Entry& e = *item.entry;
      if (item.field.is_step) {
        out[key] = ShardedTensor::whole(item.field.tensor);
      } else if (e.sharded == nullptr) {
        out[key] = detail::in_whole_tensor(ShardedTensor::whole(item.field.tensor), e);
      } else if (auto slice = detail::slice_of(item.field.tensor, e.sharded->layout())) {
        out[key] = detail::in_whole_tensor(*slice, e);
      }
    }
    return out;
  }
  detail::agree_on_keys(items, me);
  const bool keep = detail::keeps_full_entries(options);
  for (const auto& [key, item] : items) {
    const detail::Entry& e = *item.entry;
    if (!item.field.is_step) detail::refuse_full_with_tensor_parallel(e, key);
    if (!item.field.is_step && e.sharded != nullptr) {
      at::Tensor full = detail::gather_full(item.field.tensor, *e.sharded, e.group);
      if (keep) out[key] = ShardedTensor::whole(detail::full_value(full, true, options));
    } else if (keep) {
      out[key] = ShardedTensor::whole(detail::full_value(item.field.tensor, false, options));
    }
  }
  return out;
}

void set_optimizer_state_dict(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                              const ShardedStateDict& state, const StateDictOptions& options) {
  detail::check_options(options, "set_optimizer_state_dict");
  const detail::ModuleEntries me = detail::collect_module_entries(module);
  detail::prepare_for_write(me, "set_optimizer_state_dict");
  const bool full = options.full_state_dict();
  ShardedStateDict received;
  const ShardedStateDict& src = detail::state_to_load(state, options, received);
  // Keys by parameter: "<fqn>.<field>", the field never containing a dot.
  std::map<std::string, std::map<std::string, const ShardedTensor*>> by_param;
  std::vector<std::string> unexpected;
  std::map<std::string, const at::Tensor*> optimizer_params;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      auto name = me.param_names.find(p.unsafeGetTensorImpl());
      TDIST_CHECK_ARG(name != me.param_names.end(),
                      "set_optimizer_state_dict" + detail::on_rank() +
                          ": the optimizer holds a parameter the module does not have; pass "
                          "the module the optimizer was built from");
      optimizer_params[name->second] = &p;
    }
  }
  for (const auto& [key, st] : src) {
    const auto dot = key.rfind('.');
    const std::string fqn = dot == std::string::npos ? "" : key.substr(0, dot);
    const std::string field = dot == std::string::npos ? key : key.substr(dot + 1);
    if (optimizer_params.count(fqn) == 0 || util::optimizer_state_field_names().count(field) == 0) {
      unexpected.push_back(key);
      continue;
    }
    by_param[fqn][field] = &st;
  }
  if (options.strict() && !unexpected.empty()) {
    TDIST_THROW(InvalidArgument, "set_optimizer_state_dict" + detail::on_rank() +
                                     ": keys that name no state of a parameter the optimizer "
                                     "holds: [" +
                                     util::join(unexpected) +
                                     "]; keys are \"<parameter name>.<state name>\"; pass "
                                     "strict(false) to ignore them");
  }
  c10::AutoGradMode no_grad(false);
  std::vector<std::string> unused;
  for (const auto& [fqn, fields] : by_param) {
    const detail::Entry& e = me.entries.at(fqn);
    std::set<std::string> create;
    for (const auto& [field, st] : fields) create.insert(field);
    std::set<std::string> applied;
    for (auto& f :
         util::optimizer_state_fields(optimizer, *optimizer_params.at(fqn), e.local(), create)) {
      auto it = fields.find(f.name);
      if (it == fields.end()) continue;
      const std::string key = fqn + "." + f.name;
      if (f.is_step) {
        TDIST_CHECK_ARG(it->second->local.numel() == 1,
                        "set_optimizer_state_dict: '" + key + "' must hold one value");
        f.set_step(it->second->local.item<int64_t>());
      } else {
        detail::write_value(key, f.tensor, e, *it->second, full);
      }
      applied.insert(f.name);
    }
    for (const auto& [field, st] : fields) {
      if (applied.count(field) == 0) unused.push_back(fqn + "." + field);
    }
  }
  if (options.strict() && !unused.empty()) {
    TDIST_THROW(InvalidArgument, "set_optimizer_state_dict" + detail::on_rank() +
                                     ": state this optimizer type does not keep: [" +
                                     util::join(unused) +
                                     "] (the rest was loaded); pass strict(false) to ignore it");
  }
}

StateDicts get_state_dict(const torch::nn::Module& module,
                          const std::vector<torch::optim::Optimizer*>& optimizers,
                          const StateDictOptions& options) {
  detail::check_options(options, "get_state_dict");
  detail::optimizer_of_params(module, optimizers, "get_state_dict");
  StateDicts out;
  out.model = get_model_state_dict(module, options);
  for (torch::optim::Optimizer* optimizer : optimizers) {
    for (auto& [key, st] : get_optimizer_state_dict(module, *optimizer, options)) {
      out.optim.emplace(key, std::move(st));
    }
  }
  return out;
}

StateDicts get_state_dict(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                          const StateDictOptions& options) {
  return get_state_dict(module, std::vector<torch::optim::Optimizer*>{&optimizer}, options);
}

IncompatibleKeys set_state_dict(torch::nn::Module& module,
                                const std::vector<torch::optim::Optimizer*>& optimizers,
                                const ShardedStateDict& model_state_dict,
                                const ShardedStateDict& optim_state_dict,
                                const StateDictOptions& options) {
  detail::check_options(options, "set_state_dict");
  const auto owner = detail::optimizer_of_params(module, optimizers, "set_state_dict");
  ShardedStateDict received;
  const ShardedStateDict& optim_src = detail::state_to_load(optim_state_dict, options, received);
  // Each optimizer gets the keys "<fqn>.<field>" of the parameters it holds.
  std::vector<ShardedStateDict> parts(optimizers.size());
  std::vector<std::string> unexpected;
  for (const auto& [key, st] : optim_src) {
    const auto dot = key.rfind('.');
    auto it = owner.find(dot == std::string::npos ? key : key.substr(0, dot));
    if (it == owner.end()) {
      unexpected.push_back(key);
    } else {
      parts[it->second].emplace(key, st);
    }
  }
  if (options.strict() && !unexpected.empty()) {
    TDIST_THROW(InvalidArgument, "set_state_dict" + detail::on_rank() +
                                     ": optimizer state for parameters no optimizer holds: [" +
                                     util::join(unexpected) +
                                     "]; keys are \"<parameter name>.<state name>\"; pass "
                                     "strict(false) to ignore them");
  }
  // Rank 0's optimizer state is on every rank now; the model's is broadcast by its own call.
  StateDictOptions local = options;
  local.broadcast_from_rank0(false);
  for (size_t i = 0; i < optimizers.size(); ++i) {
    set_optimizer_state_dict(module, *optimizers[i], parts[i], local);
  }
  return set_model_state_dict(module, model_state_dict, options);
}

IncompatibleKeys set_state_dict(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                const ShardedStateDict& model_state_dict,
                                const ShardedStateDict& optim_state_dict,
                                const StateDictOptions& options) {
  return set_state_dict(module, std::vector<torch::optim::Optimizer*>{&optimizer}, model_state_dict,
                        optim_state_dict, options);
}

}  // namespace tdist::fsdp

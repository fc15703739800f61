#include "tdist/fsdp/fully_shard.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>

#include "fsdp/fsdp_state.h"
#include "fsdp/group_builder.h"
#include "fsdp/model_agreement.h"
#include "fsdp/registry.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/fsdp/forward.h"

namespace tdist::fsdp {

namespace detail {

namespace {

// The k-rank group this rank belongs to, for reshard_after_forward = k. Created once per
// (group, k); every rank of the group takes part in creating all of them.
ProcessGroupPtr post_forward_group(const ProcessGroupPtr& group, int k) {
  static std::mutex mutex;
  static std::map<std::pair<const ProcessGroup*, int>, ProcessGroupPtr> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(group.get(), k);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  TDIST_CHECK_ARG(group->size() == get_world_size(),
                  "fully_shard: an integer reshard_after_forward needs the world group (the "
                  "k-rank groups are created with new_group over all ranks)");
  ProcessGroupPtr mine;
  for (int b = 0; b < group->size() / k; ++b) {
    std::vector<int> ranks;
    for (int i = 0; i < k; ++i) ranks.push_back(group->global_rank(b * k + i));
    ProcessGroupPtr g = new_group(ranks);
    if (g->is_member()) mine = g;
  }
  cache[key] = mine;
  return mine;
}

}  // namespace

FSDPState& state_of(const torch::nn::Module& module) {
  FSDPState* state = find_state(module);
  if (state == nullptr) {
    TDIST_THROW(InvalidArgument, "tdist::fsdp::forward: module '" + module.name() +
                                     "' was not passed to fully_shard; call "
                                     "tdist::fsdp::fully_shard(module) first (bottom-up: "
                                     "blocks, then the root)");
  }
  return *state;
}

std::vector<at::Tensor> run_pre_forward(FSDPState& state, std::vector<at::Tensor> inputs) {
  return state.pre_forward(std::move(inputs));
}

std::vector<at::Tensor> run_post_forward(FSDPState& state, std::vector<at::Tensor> outputs) {
  return state.post_forward(std::move(outputs));
}

}  // namespace detail

namespace {

// The groups fully_shard communicates over: a 1-D mesh or group shards; a 2-D mesh is
// (replicate, shard) for HSDP.
struct MeshGroups {
  ProcessGroupPtr shard;
  ProcessGroupPtr replicate;
};

MeshGroups mesh_groups(const FullyShardOptions& options) {
  MeshGroups groups;
  groups.shard = options.process_group();
  if (const auto& mesh = options.mesh()) {
    TDIST_CHECK_ARG(!options.process_group(),
                    "fully_shard: give either mesh or process_group, not both");
    TDIST_CHECK_ARG(mesh->ndim() == 1 || mesh->ndim() == 2,
                    "fully_shard: the mesh must be 1-D (shard) or 2-D (replicate, shard) for "
                    "HSDP, got " +
                        mesh->to_string());
    if (mesh->ndim() == 1) {
      groups.shard = mesh->get_group();
    } else {
      groups.replicate = mesh->get_group(0);
      groups.shard = mesh->get_group(1);
    }
  }
  if (!groups.shard) groups.shard = group_world();
  return groups;
}

std::optional<c10::Device> compute_device(const FullyShardOptions& options) {
  if (options.mesh() && options.mesh()->device_type() == "cuda") return c10::Device(c10::kCUDA);
  return std::nullopt;  // the parameters' own device
}

}  // namespace

FSDPModule fully_shard(const std::shared_ptr<torch::nn::Module>& module,
                       const FullyShardOptions& options) {
  TDIST_CHECK_ARG(module != nullptr, "fully_shard: module is null");
  return fully_shard(std::vector<std::shared_ptr<torch::nn::Module>>{module}, options);
}

namespace {

// The reshard_after_forward group size after checking every option against the group:
// 0 for "the whole group" (true), 1 for false, k for a k-rank group.
int checked_reshard_group_size(const FullyShardOptions& options, int world, int rank) {
  int k = options.reshard_after_forward().group_size();
  TDIST_CHECK_ARG(k >= 0 && (k == 0 || world % k == 0),
                  "fully_shard: reshard_after_forward=" + std::to_string(k) + " on rank " +
                      std::to_string(rank) + " must divide the group size " +
                      std::to_string(world) + " (or be true/false)");
  TDIST_CHECK_ARG(options.all_gather_limit() >= 1, "fully_shard: all_gather_limit must be >= 1");
  for (const auto& dtype : {options.mp_policy().param_dtype(), options.mp_policy().reduce_dtype(),
                            options.mp_policy().output_dtype()}) {
    TDIST_CHECK_ARG(!dtype || c10::isFloatingType(*dtype),
                    "fully_shard: MixedPrecisionPolicy dtypes must be floating point, got " +
                        std::string(c10::toString(*dtype)));
  }
  return k == world ? 0 : k;  // a k-group the size of the world is plain resharding
}

// What one fully_shard call manages: the parameters not under an already sharded submodule
// (bottom-up) nor ignored, and the sharded submodules directly below.
struct ManagedParams {
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<std::pair<std::string, detail::FSDPState*>> children;
};

/// shard_placement_fn's dim for each parameter (Note [Sharding on another dim]), checked and
/// made non-negative; 0 without the function.
std::vector<int64_t> shard_dims(const std::vector<std::pair<std::string, at::Tensor>>& params,
                                const FullyShardOptions& options) {
  std::vector<int64_t> dims(params.size(), 0);
  if (!options.shard_placement_fn()) return dims;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, param] = params[i];
    const std::optional<tensor::Shard> placement = options.shard_placement_fn()(name, param);
    if (!placement) continue;
    const int64_t ndim = param.dim();
    const int64_t dim = placement->dim < 0 ? placement->dim + ndim : placement->dim;
    const bool valid = ndim == 0 ? dim == 0 : dim >= 0 && dim < ndim;
    if (!valid) {
      TDIST_THROW(InvalidArgument, "fully_shard: shard_placement_fn returned Shard(" +
                                       std::to_string(placement->dim) + ") for parameter '" + name +
                                       "' of shape " + c10::str(param.sizes()) +
                                       ", which has no such dim; return a dim in [-" +
                                       std::to_string(ndim) + ", " + std::to_string(ndim) +
                                       ") or nullopt for dim 0");
    }
    dims[i] = dim;
  }
  return dims;
}

ManagedParams collect_managed(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                              const FullyShardOptions& options) {
  std::unordered_set<const c10::TensorImpl*> ignored;
  for (const auto& t : options.ignored_params()) ignored.insert(t.unsafeGetTensorImpl());
  ManagedParams out;
  std::unordered_set<const c10::TensorImpl*> seen;
  std::function<void(torch::nn::Module&, const std::string&)> walk =
      [&](torch::nn::Module& m, const std::string& prefix) {
        for (const auto& item : m.named_parameters(/*recurse=*/false)) {
          const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
          if (ignored.count(impl) != 0) continue;
          if (seen.insert(impl).second) out.params.emplace_back(prefix + item.key(), item.value());
        }
        for (const auto& child : m.named_children()) {
          if (detail::FSDPState* s = detail::find_state(*child.value())) {
            out.children.emplace_back(prefix + child.key(), s);
            continue;
          }
          walk(*child.value(), prefix + child.key() + ".");
        }
      };
  // One module: names as its own named_parameters(); several: "<index>." before each.
  for (size_t i = 0; i < modules.size(); ++i) {
    walk(*modules[i], modules.size() == 1 ? "" : std::to_string(i) + ".");
  }
  return out;
}

detail::GroupConfig group_config(const FullyShardOptions& options, const MeshGroups& groups,
                                 int k) {
  detail::GroupConfig config;
  config.reshard_after_forward = k == 0 ? ReshardAfterForward(true) : ReshardAfterForward(k);
  if (k > 1) config.post_forward_group = detail::post_forward_group(groups.shard, k);
  config.replicate_group = groups.replicate;
  config.reduce_dtype = options.mp_policy().reduce_dtype() ? options.mp_policy().reduce_dtype()
                                                           : options.mp_policy().param_dtype();
  return config;
}

detail::ParamPolicy param_policy(const FullyShardOptions& options) {
  detail::ParamPolicy policy;
  policy.param_dtype = options.mp_policy().param_dtype();
  policy.compute_device = compute_device(options);
  policy.offload_to_cpu = options.offload_policy().offload_to_cpu();
  policy.pin_memory = options.offload_policy().pin_memory();
  return policy;
}

// Note [Deferred init]: true when the parameters were built on the meta device (materialize
// shards them later); a mix of meta and real parameters is refused, naming one of each.
bool built_on_meta(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  auto is_meta = [](const auto& item) { return item.second.is_meta(); };
  const auto meta = std::find_if(params.begin(), params.end(), is_meta);
  if (meta == params.end()) return false;
  const auto real = std::find_if_not(params.begin(), params.end(), is_meta);
  if (real != params.end()) {
    TDIST_THROW(InvalidArgument,
                "fully_shard: parameter '" + meta->first + "' is on the meta device but '" +
                    real->first + "' holds data (" + real->second.device().str() +
                    "); build the whole model under tdist::fsdp::MetaDeviceGuard (deferred "
                    "init) or none of it");
  }
  return true;
}

// One fully_shard call gathers and reduces its parameters as one flat buffer of one dtype
// (Note [Flat buffer layout]): parameters of another dtype would be cast into it and back,
// losing precision (float64 through float32) or imaginary parts (complex through real)
// without a word. FSDP1 refuses such a module too; FSDP2 refuses it at the reduce-scatter.
void check_one_dtype(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  if (params.empty()) return;
  const auto& [first_name, first] = params.front();
  for (const auto& [name, param] : params) {
    if (param.scalar_type() == first.scalar_type()) continue;
    TDIST_THROW(InvalidArgument,
                "fully_shard: parameter '" + name + "' is " +
                    std::string(c10::toString(param.scalar_type())) + " but '" + first_name +
                    "' is " + std::string(c10::toString(first.scalar_type())) +
                    "; one fully_shard call gathers and reduces its parameters in one dtype, so "
                    "the others would be cast and lose precision. Convert the module to one "
                    "dtype (module->to(dtype)), call fully_shard on submodules so that each "
                    "call manages one dtype, or leave those parameters out (ignored_params)");
  }
}

}  // namespace

FSDPModule fully_shard(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                       const FullyShardOptions& options) {
  TDIST_CHECK_ARG(!modules.empty(), "fully_shard: no module given");
  for (const auto& m : modules) TDIST_CHECK_ARG(m != nullptr, "fully_shard: a module is null");
  const MeshGroups groups = mesh_groups(options);
  const ProcessGroupPtr& group = groups.shard;
  TDIST_CHECK_ARG(group->is_member(), "fully_shard: rank " + std::to_string(get_rank()) +
                                          " is not a member of the group to shard over");
  const int k = checked_reshard_group_size(options, group->size(), group->rank());
  ManagedParams managed = collect_managed(modules, options);
  std::vector<int64_t> dims = shard_dims(managed.params, options);
  if (!managed.params.empty()) {  // Note [Same model on every rank]
    detail::verify_same_call_on_every_rank(
        detail::describe_fully_shard_call(modules.front()->name(), managed.params, dims, options),
        {groups.shard, groups.replicate});
  }
  check_one_dtype(managed.params);
  const bool deferred = built_on_meta(managed.params);
  detail::GroupPlan plan{std::move(managed.params), std::move(dims), group,
                         group_config(options, groups, k), param_policy(options)};

  std::unique_ptr<detail::ParamGroup> param_group;
  if (!deferred && !plan.params.empty()) {
    const c10::Device device = plan.params.front().second.device();
    detail::GroupBuilder builder(std::move(plan), device);
    for (size_t i = 0; i < builder.size(); ++i) builder.shard(i);
    param_group = builder.finish("");
  }
  auto state =
      std::make_shared<detail::FSDPState>(modules.front(), std::move(param_group), options);
  if (deferred) state->defer_group(std::move(plan));
  state->set_module_count(modules.size());
  state->set_label("root");
  for (auto& [name, child] : managed.children) {
    if (child->parent() == nullptr) child->set_parent(state.get());
    if (child->label() == "root") child->set_label(name);
  }
  for (const auto& m : modules) detail::register_state(*m, state);
  return FSDPModule(state);
}

FSDPModule fsdp_module(const torch::nn::Module& module) {
  auto state = detail::find_state_ptr(module);
  if (!state) {
    TDIST_THROW(InvalidArgument,
                "fsdp_module: module '" + module.name() + "' was not passed to fully_shard");
  }
  return FSDPModule(state);
}

bool is_fully_sharded(const torch::nn::Module& module) {
  return detail::find_state(module) != nullptr;
}

// ---- FSDPModule -------------------------------------------------------------------------

detail::FSDPState& FSDPModule::state() const {
  if (!state_) TDIST_THROW(InvalidArgument, "FSDPModule: empty handle");
  return *state_;
}

detail::FSDPState& detail::state_of(const FSDPModule& module) {
  return module.state();
}

void FSDPModule::unshard(bool async_op) {
  if (auto* g = state().group()) g->unshard(async_op, /*by_user=*/true);
}

void FSDPModule::wait_for_unshard() {
  if (auto* g = state().group()) g->wait_for_unshard();
}

void FSDPModule::reshard() {
  if (auto* g = state().group()) g->reshard();
}

bool FSDPModule::is_unsharded() const {
  auto* g = state().group();
  return g != nullptr && g->shard_state() == detail::ShardState::kUnsharded;
}

size_t FSDPModule::unsharded_bytes() const {
  auto* g = state().group();
  return g ? g->unsharded_bytes() : 0;
}

const FSDPStats& FSDPModule::stats() const {
  return state().stats();
}

void FSDPModule::reset_stats() {
  state().stats() = FSDPStats();
}

const std::string& FSDPModule::label() const {
  return state().label();
}

namespace {

std::vector<detail::FSDPState*> states_under(detail::FSDPState& state) {
  auto module = state.module().lock();
  if (!module) return {&state};
  return detail::states_under(*module);
}

/// The groups of `state` and, with recurse, of every fully_shard'ed module below it: what
/// the FSDPModule setters with a `recurse` argument apply to.
std::vector<detail::ParamGroup*> groups_under(detail::FSDPState& state, bool recurse) {
  std::vector<detail::ParamGroup*> groups;
  for (detail::FSDPState* s :
       recurse ? states_under(state) : std::vector<detail::FSDPState*>{&state}) {
    if (auto* g = s->group()) groups.push_back(g);
  }
  return groups;
}

std::vector<detail::ParamGroup*> groups_of(const std::vector<FSDPModule>& modules) {
  std::vector<detail::ParamGroup*> groups;
  for (const auto& m : modules) {
    if (auto* g = detail::state_of(m).group()) groups.push_back(g);
  }
  return groups;
}

}  // namespace

void FSDPModule::set_requires_gradient_sync(bool requires_gradient_sync, bool recurse) {
  for (detail::ParamGroup* g : groups_under(state(), recurse))
    g->set_requires_gradient_sync(requires_gradient_sync);
}

void FSDPModule::set_reshard_after_forward(bool reshard_after_forward, bool recurse) {
  for (detail::ParamGroup* g : groups_under(state(), recurse))
    g->set_reshard_after_forward(reshard_after_forward);
}

void FSDPModule::set_all_reduce_hook(AllReduceHook hook) {
  if (auto* g = state().group()) g->set_all_reduce_hook(std::move(hook));
}

void FSDPModule::set_unshard_in_backward(bool unshard_in_backward) {
  if (auto* g = state().group()) g->set_unshard_in_backward(unshard_in_backward);
}

void FSDPModule::set_custom_all_gather(std::shared_ptr<AllGather> comm) {
  if (auto* g = state().group()) g->set_custom_all_gather(std::move(comm));
}

void FSDPModule::set_custom_reduce_scatter(std::shared_ptr<ReduceScatter> comm) {
  if (auto* g = state().group()) g->set_custom_reduce_scatter(std::move(comm));
}

void FSDPModule::set_reshard_after_backward(bool reshard_after_backward, bool recurse) {
  for (detail::ParamGroup* g : groups_under(state(), recurse))
    g->set_reshard_after_backward(reshard_after_backward);
}

void FSDPModule::set_requires_all_reduce(bool requires_all_reduce, bool recurse) {
  for (detail::ParamGroup* g : groups_under(state(), recurse))
    g->set_requires_all_reduce(requires_all_reduce);
}

void FSDPModule::set_post_optim_event(std::shared_ptr<c10::Event> event) {
  state().set_post_optim_event(std::move(event));
}

void FSDPModule::set_is_last_backward(bool is_last_backward) {
  state().set_is_last_backward(is_last_backward);
}

void FSDPModule::set_gradient_divide_factor(double factor) {
  TDIST_CHECK_ARG(factor > 0, "set_gradient_divide_factor: the factor must be positive, got " +
                                  std::to_string(factor));
  if (auto* g = state().group()) g->set_gradient_divide_factor(factor);
}

bool FSDPModule::requires_gradient_sync() const {
  auto* g = state().group();
  return g == nullptr || g->requires_gradient_sync();
}

void FSDPModule::set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules) {
  if (auto* g = state().group()) g->set_forward_prefetch(groups_of(modules));
}

void FSDPModule::set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules) {
  if (auto* g = state().group()) g->set_backward_prefetch(groups_of(modules));
}

NoSync::NoSync(FSDPModule module)
    : module_(std::move(module)), previous_(module_.requires_gradient_sync()) {
  module_.set_requires_gradient_sync(false);
}

NoSync::~NoSync() {
  module_.set_requires_gradient_sync(previous_);
}

}  // namespace tdist::fsdp

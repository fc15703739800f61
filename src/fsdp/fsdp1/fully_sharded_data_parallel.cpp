// FSDP1's FullyShardedDataParallel on the fully_shard core: option translation (one place,
// validated up front, before any collective), the mesh for each ShardingStrategy,
// sync_module_states, buffer_dtype, device_id, and auto-wrapping bottom-up with the options
// of each unit (a CustomPolicy's overrides).

#include "tdist/fsdp/fully_sharded_data_parallel.h"

#include <cstdlib>
#include <limits>
#include <unordered_set>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "fsdp/fsdp1/auto_wrap.h"
#include "fsdp/fsdp1/device_id.h"
#include "fsdp/fsdp1/strategy.h"
#include "tdist/comm/broadcast_coalesced.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/fsdp/clip_grad.h"

namespace tdist::fsdp {

namespace detail {

namespace {

// "unlimited" for limit_all_gathers = false: more than any model has modules.
constexpr int kUnlimitedAllGathers = 1 << 20;
// FSDP1's rate limiter allows two all-gathers in flight.
constexpr int kLimitedAllGathers = 2;

std::string device_type_of(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) {
    if (p.is_cuda()) return "cuda";
  }
  return "cpu";
}

// The mesh a strategy needs (nullopt: shard over options.process_group() or the world).
std::optional<mesh::DeviceMesh> mesh_for(const FSDPOptions& o, const torch::nn::Module& module) {
  const ShardingStrategy s = o.sharding_strategy();
  const std::string at = where(s);
  if (o.process_group() && o.device_mesh()) {
    TDIST_THROW(InvalidArgument,
                at + "both process_group and device_mesh were given; pass only one");
  }
  const int world = get_world_size();
  const std::string device = device_type_of(module);
  if (s == ShardingStrategy::FULL_SHARD || s == ShardingStrategy::SHARD_GRAD_OP) {
    if (o.device_mesh() && o.device_mesh()->ndim() != 1) {
      TDIST_THROW(InvalidArgument, at + "device_mesh " + o.device_mesh()->to_string() +
                                       " must be 1-D; for a 2-D (replicate, shard) mesh use "
                                       "HYBRID_SHARD");
    }
    return o.device_mesh();
  }
  if (o.process_group() && get_world_size(o.process_group()) != world) {
    TDIST_THROW(InvalidArgument, at + "a process_group of " +
                                     std::to_string(get_world_size(o.process_group())) +
                                     " ranks (world " + std::to_string(world) +
                                     ") is not supported here; pass a 2-D device_mesh "
                                     "(replicate, shard) instead");
  }
  if (s == ShardingStrategy::NO_SHARD) {
    if (o.device_mesh()) {
      const auto& m = *o.device_mesh();
      if (m.ndim() != 2 || m.shape()[1] != 1) {
        TDIST_THROW(InvalidArgument, at + "device_mesh " + m.to_string() +
                                         " must be 2-D with a shard dimension of size 1 "
                                         "(replicate only); or pass no mesh");
      }
      return m;
    }
    return mesh::init_device_mesh(device, {world, 1}, {"replicate", "shard"});
  }
  // Hybrid.
  if (o.device_mesh()) {
    if (o.device_mesh()->ndim() != 2) {
      TDIST_THROW(InvalidArgument, at + "device_mesh " + o.device_mesh()->to_string() +
                                       " must be 2-D (replicate, shard)");
    }
    return o.device_mesh();
  }
  const char* env = std::getenv("LOCAL_WORLD_SIZE");
  if (env == nullptr || *env == '\0') {
    TDIST_THROW(InvalidArgument, at + "the ranks per node are unknown: set LOCAL_WORLD_SIZE "
                                      "(the launcher does) or pass a 2-D device_mesh "
                                      "(replicate, shard)");
  }
  char* end = nullptr;
  const long local = std::strtol(env, &end, 10);
  if (*end != '\0' || local <= 0 || world % local != 0) {
    TDIST_THROW(InvalidArgument, at + "LOCAL_WORLD_SIZE=" + env +
                                     " must be a positive divisor of the world size " +
                                     std::to_string(world) +
                                     "; fix it or pass a 2-D device_mesh (replicate, shard)");
  }
  return mesh::init_device_mesh(device, {world / local, local}, {"replicate", "shard"});
}

// Note [Sync module states]: every parameter and buffer in bucketed broadcasts, after
// checking (one small all-reduce) that every rank has the same number of tensors and
// elements, since mismatched broadcasts would hang or corrupt instead of failing.
void sync_module_states(const std::vector<at::Tensor>& tensors, const ProcessGroupPtr& group,
                        const std::string& at) {
  torch::NoGradGuard no_grad;
  int64_t numel = 0;
  for (const auto& t : tensors) numel += t.numel();
  const int64_t n = static_cast<int64_t>(tensors.size());
  auto shape = to_collective_device(torch::tensor({n, numel, -n, -numel}, torch::kInt64), group);
  all_reduce(shape, ReduceOp::MAX, group);
  shape = shape.cpu();
  if (shape[0].item<int64_t>() != -shape[2].item<int64_t>() ||
      shape[1].item<int64_t>() != -shape[3].item<int64_t>()) {
    TDIST_THROW(InvalidArgument, at +
                                     "sync_module_states: ranks hold different models (this "
                                     "rank: " +
                                     std::to_string(n) + " tensors, " + std::to_string(numel) +
                                     " elements); build the same model on every rank");
  }
  broadcast_coalesced(tensors, group ? get_global_rank(group, 0) : 0, group);
}

// Ignored modules (with every submodule) and parameters, validated before any collective.
struct Ignored {
  std::unordered_set<const torch::nn::Module*> modules;
  std::unordered_set<const c10::TensorImpl*> params;
  std::vector<at::Tensor> param_list;  // the same, in order, for FullyShardOptions
};

// ignored_states as Python's: all modules or all parameters, and not with the older options.
void split_ignored_states(const FSDPOptions& options, const std::string& at,
                          std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                          std::vector<at::Tensor>& params) {
  modules = options.ignored_modules();
  params = options.ignored_parameters();
  const auto& states = options.ignored_states();
  if (states.empty()) return;
  if (!modules.empty() || !params.empty()) {
    TDIST_THROW(InvalidArgument, at + "both ignored_states and ignored_modules / "
                                      "ignored_parameters were given; pass only ignored_states");
  }
  for (const IgnoredState& state : states) {
    if (const auto* m = state.module()) modules.push_back(*m);
    if (const auto* p = state.parameter()) params.push_back(*p);
  }
  if (!modules.empty() && !params.empty()) {
    TDIST_THROW(InvalidArgument, at + "ignored_states mixes " + std::to_string(modules.size()) +
                                     " module(s) and " + std::to_string(params.size()) +
                                     " parameter(s); as in PyTorch, pass all modules or all "
                                     "parameters (a module's parameters are ignored with it)");
  }
}

Ignored collect_ignored(const torch::nn::Module& root, const FSDPOptions& options,
                        const std::string& at) {
  std::vector<std::shared_ptr<torch::nn::Module>> ignored_modules;
  std::vector<at::Tensor> ignored_parameters;
  split_ignored_states(options, at, ignored_modules, ignored_parameters);
  const char* modules_option =
      options.ignored_states().empty() ? "ignored_modules" : "ignored_states";
  const char* params_option =
      options.ignored_states().empty() ? "ignored_parameters" : "ignored_states";
  Ignored out;
  std::unordered_set<const c10::TensorImpl*> own_params;
  for (const auto& p : root.parameters()) own_params.insert(p.unsafeGetTensorImpl());
  auto ignore = [&](const at::Tensor& p) {
    if (out.params.insert(p.unsafeGetTensorImpl()).second) out.param_list.push_back(p);
  };
  for (size_t i = 0; i < ignored_modules.size(); ++i) {
    const auto& m = ignored_modules[i];
    TDIST_CHECK_ARG(m != nullptr,
                    at + modules_option + "[" + std::to_string(i) + "] is a null module");
    if (m.get() == &root) {
      TDIST_THROW(InvalidArgument, at + "the root module itself is in " + modules_option +
                                       "; to keep everything unsharded do not wrap it");
    }
    for (const auto& sub : m->modules(/*include_self=*/true)) out.modules.insert(sub.get());
    for (const auto& p : m->parameters()) ignore(p);
  }
  for (size_t i = 0; i < ignored_parameters.size(); ++i) {
    const at::Tensor& p = ignored_parameters[i];
    if (!p.defined() || own_params.count(p.unsafeGetTensorImpl()) == 0) {
      TDIST_THROW(InvalidArgument, at + params_option + "[" + std::to_string(i) +
                                       "] is not a parameter of the module; pass tensors "
                                       "from module->parameters()");
    }
    ignore(p);
  }
  return out;
}

// What the FSDP1 options become on fully_shard: the root's options and its children's (they
// differ only in whether forward inputs are cast: cast_root_forward_inputs).
struct TranslatedOptions {
  FullyShardOptions root;
  FullyShardOptions children;
};

TranslatedOptions translate_options(const FSDPOptions& options,
                                    const std::optional<mesh::DeviceMesh>& mesh,
                                    const std::vector<at::Tensor>& ignored_params) {
  const ShardingStrategy s = options.sharding_strategy();
  FullyShardOptions root;
  if (mesh) {
    root.mesh(*mesh);
  } else if (options.process_group()) {
    root.process_group(options.process_group());
  }
  root.reshard_after_forward(reshards_after_forward(s));
  root.all_gather_limit(options.limit_all_gathers() ? kLimitedAllGathers : kUnlimitedAllGathers);
  root.prefetch(true);
  root.forward_prefetch(options.forward_prefetch());
  root.backward_prefetch(options.backward_prefetch().has_value());
  root.ignored_params(ignored_params);
  if (options.cpu_offload() && options.cpu_offload()->offload_params()) {
    root.offload_policy(CPUOffloadPolicy(/*pin_memory=*/torch::cuda::is_available()));
  }
  FullyShardOptions children = root;
  if (const auto& mp = options.mixed_precision()) {
    auto policy =
        MixedPrecisionPolicy().param_dtype(mp->param_dtype()).reduce_dtype(mp->reduce_dtype());
    children.mp_policy(MixedPrecisionPolicy(policy).cast_forward_inputs(mp->cast_forward_inputs()));
    root.mp_policy(policy.cast_forward_inputs(mp->cast_root_forward_inputs()));
  }
  return {root, children};
}

// A CustomPolicy's overrides, checked against the root's options before any collective.
void check_overrides(const std::vector<WrapTarget>& targets, const FSDPOptions& options,
                     const std::string& at) {
  const ShardingStrategy root_strategy = options.sharding_strategy();
  std::optional<c10::ScalarType> root_buffer_dtype;
  if (options.mixed_precision()) root_buffer_dtype = options.mixed_precision()->buffer_dtype();
  for (const WrapTarget& t : targets) {
    const FSDPUnitOptions& o = t.overrides;
    const std::string unit = at + "CustomPolicy's options for '" + t.name + "': ";
    if (o.sharding_strategy() &&
        strategy_family(*o.sharding_strategy()) != strategy_family(root_strategy)) {
      TDIST_THROW(InvalidArgument,
                  unit + "sharding_strategy " + strategy_name(*o.sharding_strategy()) +
                      " needs another mesh than the root's " + strategy_name(root_strategy) +
                      "; every unit shards over the root's mesh, so a unit may only switch "
                      "between FULL_SHARD and SHARD_GRAD_OP, or HYBRID_SHARD and "
                      "HYBRID_SHARD_ZERO2");
    }
    if (o.mixed_precision() && o.mixed_precision()->buffer_dtype() &&
        o.mixed_precision()->buffer_dtype() != root_buffer_dtype) {
      TDIST_THROW(InvalidArgument, unit +
                                       "a buffer_dtype other than the root's: buffers are "
                                       "cast once, for the whole model; set buffer_dtype in "
                                       "the FSDPOptions' mixed_precision");
    }
  }
}

// A unit's fully_shard options: the children's, with the CustomPolicy's overrides.
FullyShardOptions unit_options(FullyShardOptions options, const FSDPUnitOptions& o) {
  if (o.sharding_strategy())
    options.reshard_after_forward(reshards_after_forward(*o.sharding_strategy()));
  if (const auto& mp = o.mixed_precision()) {
    options.mp_policy(MixedPrecisionPolicy()
                          .param_dtype(mp->param_dtype())
                          .reduce_dtype(mp->reduce_dtype())
                          .cast_forward_inputs(mp->cast_forward_inputs()));
  }
  if (const auto& offload = o.cpu_offload()) {
    options.offload_policy(offload->offload_params()
                               ? OffloadPolicy(CPUOffloadPolicy(torch::cuda::is_available()))
                               : OffloadPolicy());
  }
  return options;
}

std::vector<WrapTarget> plan_wrap(const std::shared_ptr<torch::nn::Module>& root,
                                  const WrapPolicy& policy, const Ignored& ignored) {
  if (policy.custom()) return plan_custom_wrap(root, *policy.custom(), ignored.modules);
  return plan_auto_wrap(root, policy.callable(), ignored.modules, ignored.params);
}

// sync_module_states and buffer_dtype, on the parameters and buffers outside ignored modules.
void prepare_module_states(torch::nn::Module& root, const FSDPOptions& options,
                           const std::optional<mesh::DeviceMesh>& mesh, const Ignored& ignored,
                           const std::string& at) {
  std::vector<at::Tensor> states;
  std::vector<at::Tensor> buffers;
  for (const auto& p : root.parameters()) {
    if (ignored.params.count(p.unsafeGetTensorImpl()) == 0) states.push_back(p);
  }
  for (const auto& m : root.modules(/*include_self=*/true)) {
    if (ignored.modules.count(m.get()) != 0) continue;
    for (const auto& b : m->buffers(/*recurse=*/false)) buffers.push_back(b);
  }
  if (options.sync_module_states()) {
    ProcessGroupPtr group = options.process_group();
    if (!group && mesh && mesh->ndim() == 1) group = mesh->get_group();
    std::vector<at::Tensor> all = states;
    all.insert(all.end(), buffers.begin(), buffers.end());
    sync_module_states(all, group, at);
  }
  if (const auto& mp = options.mixed_precision(); mp && mp->buffer_dtype()) {
    torch::NoGradGuard no_grad;
    for (auto& b : buffers) {
      if (b.is_floating_point()) b.set_data(b.to(*mp->buffer_dtype()));
    }
  }
}

}  // namespace

FullyShardedBase::FullyShardedBase(std::shared_ptr<torch::nn::Module> module, FSDPOptions options)
    : module_ptr_(std::move(module)), options_(std::move(options)) {
  const ShardingStrategy s = options_.sharding_strategy();
  TDIST_CHECK_ARG(module_ptr_ != nullptr, "FullyShardedDataParallel: the module is null");
  if (!is_initialized()) {
    TDIST_THROW(InvalidArgument, "FullyShardedDataParallel(" + strategy_name(s) +
                                     "): the default process group is not initialised; "
                                     "call tdist::init_process_group() first");
  }
  const std::string at = where(s);
  if (is_fully_sharded(*module_ptr_)) {
    TDIST_THROW(InvalidArgument, at + "the module is already sharded (fully_shard or another "
                                      "FullyShardedDataParallel); wrap it once");
  }
  const Ignored ignored = collect_ignored(*module_ptr_, options_, at);
  const std::vector<WrapTarget> targets =
      plan_wrap(module_ptr_, options_.auto_wrap_policy(), ignored);
  check_overrides(targets, options_, at);
  compute_device_ =
      place_on_device(*module_ptr_, options_.device_id(), ignored.modules, ignored.params, at);
  mesh_ = mesh_for(options_, *module_ptr_);
  const TranslatedOptions translated = translate_options(options_, mesh_, ignored.param_list);
  shard_options_ = translated.root;
  prepare_module_states(*module_ptr_, options_, mesh_, ignored, at);

  // Bottom-up: the policy's submodules, then the root (Python's _recursive_wrap with
  // only_wrap_children, or _post_order_apply, then the outer wrapper).
  for (const auto& target : targets) {
    fully_shard(target.module, unit_options(translated.children, target.overrides));
    wrapped_names_.push_back(target.name);
  }
  root_ = fully_shard(module_ptr_, shard_options_);
  wrapped_names_.emplace_back();
}

std::vector<FSDPModule> FullyShardedBase::fsdp_modules() const {
  std::vector<FSDPModule> out;
  for (const auto& m : module_ptr_->modules(/*include_self=*/true)) {
    if (is_fully_sharded(*m)) out.push_back(tdist::fsdp::fsdp_module(*m));
  }
  return out;
}

at::Tensor FullyShardedBase::clip_grad_norm_(double max_norm, double norm_type) const {
  return tdist::fsdp::clip_grad_norm_(*module_ptr_, max_norm, norm_type);
}

ShardedStateDict FullyShardedBase::state_dict(const StateDictOptions& options) const {
  return get_model_state_dict(*module_ptr_, options);
}

void FullyShardedBase::load_state_dict(const ShardedStateDict& state,
                                       const StateDictOptions& options) {
  set_model_state_dict(*module_ptr_, state, options);
}

ShardedStateDict FullyShardedBase::optim_state_dict(torch::optim::Optimizer& optimizer,
                                                    const StateDictOptions& options) const {
  return get_optimizer_state_dict(*module_ptr_, optimizer, options);
}

void FullyShardedBase::load_optim_state_dict(torch::optim::Optimizer& optimizer,
                                             const ShardedStateDict& state,
                                             const StateDictOptions& options) {
  set_optimizer_state_dict(*module_ptr_, optimizer, state, options);
}

}  // namespace detail
}  // namespace tdist::fsdp

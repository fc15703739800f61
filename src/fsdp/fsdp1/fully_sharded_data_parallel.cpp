// FSDP1's FullyShardedDataParallel on the fully_shard core: option translation (one place,
// validated up front, before any collective), the mesh for each ShardingStrategy,
// sync_module_states, buffer_dtype, and auto-wrapping bottom-up.

#include "tdist/fsdp/fully_sharded_data_parallel.h"

#include <cstdlib>
#include <limits>
#include <unordered_set>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "fsdp/fsdp1/auto_wrap.h"
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

std::string strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FULL_SHARD:
      return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP:
      return "SHARD_GRAD_OP";
    case ShardingStrategy::NO_SHARD:
      return "NO_SHARD";
    case ShardingStrategy::HYBRID_SHARD:
      return "HYBRID_SHARD";
    case ShardingStrategy::HYBRID_SHARD_ZERO2:
      return "HYBRID_SHARD_ZERO2";
  }
  return "?";
}

std::string where(ShardingStrategy s) {
  return "FullyShardedDataParallel(" + strategy_name(s) + ") on rank " +
         std::to_string(get_rank()) + ": ";
}

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

Ignored collect_ignored(const torch::nn::Module& root, const FSDPOptions& options,
                        const std::string& at) {
  Ignored out;
  std::unordered_set<const c10::TensorImpl*> own_params;
  for (const auto& p : root.parameters()) own_params.insert(p.unsafeGetTensorImpl());
  auto ignore = [&](const at::Tensor& p) {
    if (out.params.insert(p.unsafeGetTensorImpl()).second) out.param_list.push_back(p);
  };
  for (size_t i = 0; i < options.ignored_modules().size(); ++i) {
    const auto& m = options.ignored_modules()[i];
    TDIST_CHECK_ARG(m != nullptr, at + "ignored_modules[" + std::to_string(i) + "] is null");
    if (m.get() == &root) {
      TDIST_THROW(InvalidArgument, at + "the root module itself is in ignored_modules; to "
                                        "keep everything unsharded do not wrap it");
    }
    for (const auto& sub : m->modules(/*include_self=*/true)) out.modules.insert(sub.get());
    for (const auto& p : m->parameters()) ignore(p);
  }
  for (size_t i = 0; i < options.ignored_parameters().size(); ++i) {
    const at::Tensor& p = options.ignored_parameters()[i];
    if (!p.defined() || own_params.count(p.unsafeGetTensorImpl()) == 0) {
      TDIST_THROW(InvalidArgument, at + "ignored_parameters[" + std::to_string(i) +
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
  const bool reshard = s == ShardingStrategy::FULL_SHARD || s == ShardingStrategy::HYBRID_SHARD;
  root.reshard_after_forward(reshard);
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
  mesh_ = mesh_for(options_, *module_ptr_);
  const TranslatedOptions translated = translate_options(options_, mesh_, ignored.param_list);
  shard_options_ = translated.root;
  prepare_module_states(*module_ptr_, options_, mesh_, ignored, at);

  // Bottom-up: the policy's submodules, then the root (Python's _recursive_wrap with
  // only_wrap_children, then the outer wrapper).
  for (const auto& target :
       plan_auto_wrap(module_ptr_, options_.auto_wrap_policy(), ignored.modules, ignored.params)) {
    fully_shard(target.module, translated.children);
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

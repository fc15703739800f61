#pragma once

// The FSDP1 surface (torch.distributed.fsdp.FullyShardedDataParallel) as a thin layer over
// fully_shard: a wrapper that auto-wraps submodules (fully_shard bottom-up, then the root)
// and translates FSDP1's options to FullyShardOptions.
//
//   TinyTransformer model(cfg);
//   tdist::fsdp::FullyShardedDataParallel fsdp(
//       model, tdist::fsdp::FSDPOptions()
//                  .sharding_strategy(tdist::fsdp::ShardingStrategy::SHARD_GRAD_OP)
//                  .auto_wrap_policy(tdist::fsdp::module_type_wrap_policy<TinyBlockImpl>()));
//   torch::optim::AdamW opt(fsdp.parameters(), ...);
//   auto loss = loss_fn(fsdp.forward(x), y); loss.backward(); opt.step();
//
// Unlike Python, the wrapped submodules are not replaced by wrapper objects (parameter
// names do not change): fully_shard is applied to them in place, so inside the model's
// forward each wrapped submodule must be called through tdist::fsdp::forward(block, x)
// (see docs/fsdp.md, "How FSDP gets control of a module's forward"). A wrapped module
// called directly raises on the first forward.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include "tdist/arg.h"
#include "tdist/comm/process_group.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/full_params.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/state_dict.h"
#include "tdist/mesh/device_mesh.h"
#include "tdist/util/sharded_tensor.h"

namespace tdist::fsdp {

/// FSDP1's ShardingStrategy, and what each becomes on the fully_shard core.
enum class ShardingStrategy {
  /// Parameters, gradients and optimizer state sharded; parameters freed after forward
  /// (reshard_after_forward = true; ZeRO-3). The default.
  FULL_SHARD,
  /// Parameters kept unsharded from forward until after backward
  /// (reshard_after_forward = false; ZeRO-2).
  SHARD_GRAD_OP,
  /// Nothing sharded: gradients all-reduced (DDP). A 2-D mesh (world, 1): replicate-only HSDP.
  NO_SHARD,
  /// FULL_SHARD within a node, replicated across nodes: a 2-D mesh (world / local, local),
  /// local = LOCAL_WORLD_SIZE or given by device_mesh.
  HYBRID_SHARD,
  /// HYBRID_SHARD with SHARD_GRAD_OP within a node (Python's _HYBRID_SHARD_ZERO2).
  HYBRID_SHARD_ZERO2,
};

/// FSDP1's BackwardPrefetch. Both prefetch the previous module's all-gather in backward;
/// tdist's core issues it at the module's pre-backward (BACKWARD_PRE). BACKWARD_POST is
/// accepted and behaves as BACKWARD_PRE (same results; it only changes overlap and peak
/// memory in PyTorch). No prefetch: leave FSDPOptions::backward_prefetch unset.
enum class BackwardPrefetch { BACKWARD_PRE, BACKWARD_POST };

/// FSDP1's MixedPrecision. Unset dtypes mean "no cast".
///  param_dtype  : dtype of the all-gathered (unsharded) parameters and of the computation.
///  reduce_dtype : dtype gradients are reduced in; default param_dtype.
///  buffer_dtype : buffers are cast to it once, when the wrapper is built.
///  cast_forward_inputs : cast floating inputs of every wrapped submodule to param_dtype.
///  cast_root_forward_inputs : cast floating inputs of the root to param_dtype.
struct MixedPrecision {
  TDIST_ARG(std::optional<c10::ScalarType>, param_dtype) = std::nullopt;
  TDIST_ARG(std::optional<c10::ScalarType>, reduce_dtype) = std::nullopt;
  TDIST_ARG(std::optional<c10::ScalarType>, buffer_dtype) = std::nullopt;
  TDIST_ARG(bool, cast_forward_inputs) = false;
  TDIST_ARG(bool, cast_root_forward_inputs) = true;
};

/// FSDP1's CPUOffload: offload_params keeps the sharded parameters, their gradients and so
/// the optimizer state in host memory (CPUOffloadPolicy on the core).
struct CPUOffload {
  TDIST_ARG(bool, offload_params) = false;
};

/// FSDP1's auto_wrap_policy callable: called with recurse = true to ask whether to descend
/// into `module` (nonwrapped_numel: all its parameters), then, after its children, with
/// recurse = false to ask whether to wrap it (nonwrapped_numel: its parameters no wrapped
/// descendant took). Ignored parameters are never counted. The root is always wrapped.
using AutoWrapPolicy =
    std::function<bool(const torch::nn::Module& module, bool recurse, int64_t nonwrapped_numel)>;

/// A predicate on modules (e.g. "is a TinyBlockImpl").
using ModulePredicate = std::function<bool(const torch::nn::Module& module)>;

/// Python's ModuleWrapPolicy / transformer_auto_wrap_policy: wraps every module for which
/// `is_wrap_module` holds; descends everywhere.
AutoWrapPolicy module_wrap_policy(ModulePredicate is_wrap_module);

/// module_wrap_policy by type: wraps every module whose Impl is one of `Impls` (or derives
/// from one), e.g. module_type_wrap_policy<TinyBlockImpl>().
template <class... Impls>
AutoWrapPolicy module_type_wrap_policy() {
  static_assert(sizeof...(Impls) > 0, "module_type_wrap_policy: name at least one module type");
  return module_wrap_policy([](const torch::nn::Module& m) {
    return (... || (dynamic_cast<const Impls*>(&m) != nullptr));
  });
}

/// Python's lambda_auto_wrap_policy: wraps every module for which `fn` holds.
AutoWrapPolicy lambda_auto_wrap_policy(ModulePredicate fn);

/// Python's always_wrap_policy: every submodule (with parameters) becomes its own unit.
AutoWrapPolicy always_wrap_policy();

/// Python's size_based_auto_wrap_policy: wraps a module once the parameters no wrapped
/// descendant took number at least `min_num_params`. Never descends into a force-leaf module
/// (default: MultiheadAttention) and never wraps an excluded one (default: ModuleList,
/// ModuleDict: containers have no forward of their own).
AutoWrapPolicy size_based_auto_wrap_policy(int64_t min_num_params = 100000000,
                                           ModulePredicate force_leaf_modules = nullptr,
                                           ModulePredicate exclude_wrap_modules = nullptr);

struct FSDPOptions {
  /// Ranks to shard over (FULL_SHARD / SHARD_GRAD_OP). Default: the world. Not with
  /// device_mesh.
  TDIST_ARG(ProcessGroupPtr, process_group) = nullptr;
  /// The mesh: 1-D for FULL_SHARD / SHARD_GRAD_OP; 2-D (replicate, shard) for HYBRID_SHARD
  /// (and for NO_SHARD with a shard dimension of size 1). Default: built from the world.
  TDIST_ARG(std::optional<mesh::DeviceMesh>, device_mesh) = std::nullopt;
  TDIST_ARG(ShardingStrategy, sharding_strategy) = ShardingStrategy::FULL_SHARD;
  /// Which submodules get their own fully_shard (bottom-up). Unset: only the root.
  TDIST_ARG(AutoWrapPolicy, auto_wrap_policy) = nullptr;
  /// Unset: no backward prefetch.
  TDIST_ARG(std::optional<BackwardPrefetch>, backward_prefetch) = BackwardPrefetch::BACKWARD_PRE;
  /// Prefetch the next module's all-gather in forward (FSDP1 default: off).
  TDIST_ARG(bool, forward_prefetch) = false;
  /// At most two all-gathers in flight (FSDP1's rate limiter); false: unlimited.
  TDIST_ARG(bool, limit_all_gathers) = true;
  /// Broadcast every parameter and buffer from the group's first rank before sharding, so
  /// ranks that initialised differently start identical. Collective.
  TDIST_ARG(bool, sync_module_states) = false;
  /// Modules (with all their descendants) left alone: not wrapped, not sharded, not
  /// reduced; each rank keeps its own copy of their parameters and buffers.
  TDIST_ARG(std::vector<std::shared_ptr<torch::nn::Module>>, ignored_modules) = {};
  /// Single parameters left alone, as ignored_modules.
  TDIST_ARG(std::vector<at::Tensor>, ignored_parameters) = {};
  TDIST_ARG(std::optional<MixedPrecision>, mixed_precision) = std::nullopt;
  TDIST_ARG(std::optional<CPUOffload>, cpu_offload) = std::nullopt;
};

namespace detail {

inline std::shared_ptr<torch::nn::Module> as_module_ptr(
    const std::shared_ptr<torch::nn::Module>& module) {
  return module;
}
template <class Impl>
std::shared_ptr<torch::nn::Module> as_module_ptr(const std::shared_ptr<Impl>& module) {
  return std::static_pointer_cast<torch::nn::Module>(module);
}
template <class Impl>
std::shared_ptr<torch::nn::Module> as_module_ptr(const torch::nn::ModuleHolder<Impl>& module) {
  return std::static_pointer_cast<torch::nn::Module>(module.ptr());
}

/// The type-independent part of FullyShardedDataParallel (everything but forward).
class FullyShardedBase {
 public:
  FullyShardedBase(std::shared_ptr<torch::nn::Module> module, FSDPOptions options);

  const FSDPOptions& options() const { return options_; }
  ShardingStrategy sharding_strategy() const { return options_.sharding_strategy(); }
  /// The mesh the parameters are sharded over, when one was given or built.
  const std::optional<mesh::DeviceMesh>& device_mesh() const { return mesh_; }
  /// The FullyShardOptions the root was sharded with (what the FSDP1 options became).
  const FullyShardOptions& fully_shard_options() const { return shard_options_; }

  /// The root's handle (FSDPModule: unshard/reshard, stats, set_requires_gradient_sync...).
  FSDPModule fsdp_module() const { return root_; }
  /// Every module fully_shard was applied to, in module order, the root first (Python's
  /// FullyShardedDataParallel.fsdp_modules).
  std::vector<FSDPModule> fsdp_modules() const;
  /// Names (as named_modules() gives them; "" for the root) of the modules wrapped, in the
  /// order fully_shard was applied (bottom-up, the root last).
  const std::vector<std::string>& wrapped_module_names() const { return wrapped_names_; }

  /// The (sharded) parameters: give these to the optimizer.
  std::vector<at::Tensor> parameters() const { return module_ptr_->parameters(); }
  torch::OrderedDict<std::string, at::Tensor> named_parameters() const {
    return module_ptr_->named_parameters();
  }
  void train(bool on = true) { module_ptr_->train(on); }
  void eval() { module_ptr_->eval(); }

  /// Gradient accumulation without communication in this scope (FSDP1's no_sync()).
  NoSync no_sync() const { return NoSync(root_); }
  /// Clips the gradients by their global norm; returns the total norm (float32 scalar).
  at::Tensor clip_grad_norm_(double max_norm, double norm_type = 2.0) const;
  /// Full parameters in a scope (FSDP1's summon_full_params). Collective.
  SummonFullParams summon_full_params(const SummonFullParamsOptions& options = {}) const {
    return SummonFullParams(*module_ptr_, options);
  }

  /// Model and optimizer state dicts (state_dict.h: full or sharded by `options`).
  ShardedStateDict state_dict(const StateDictOptions& options = {}) const;
  void load_state_dict(const ShardedStateDict& state, const StateDictOptions& options = {});
  ShardedStateDict optim_state_dict(torch::optim::Optimizer& optimizer,
                                    const StateDictOptions& options = {}) const;
  void load_optim_state_dict(torch::optim::Optimizer& optimizer, const ShardedStateDict& state,
                             const StateDictOptions& options = {});

 protected:
  std::shared_ptr<torch::nn::Module> module_ptr_;

 private:
  FSDPOptions options_;
  std::optional<mesh::DeviceMesh> mesh_;
  FullyShardOptions shard_options_;
  FSDPModule root_;
  std::vector<std::string> wrapped_names_;
};

}  // namespace detail

/// FSDP1's FullyShardedDataParallel over a module `M` (a ModuleHolder such as TinyTransformer,
/// or a std::shared_ptr to the Impl). Construction is collective: every rank builds it with
/// the same options, in the same order as its other collectives. Build the optimizer from
/// parameters() afterwards.
template <class M>
class FullyShardedDataParallel : public detail::FullyShardedBase {
 public:
  explicit FullyShardedDataParallel(M module, FSDPOptions options = {})
      : detail::FullyShardedBase(detail::as_module_ptr(module), std::move(options)),
        module_(std::move(module)) {}

  /// The module's forward through FSDP (tdist::fsdp::forward(module(), args...)).
  template <class... Args>
  auto forward(Args&&... args) {
    return tdist::fsdp::forward(module_, std::forward<Args>(args)...);
  }
  template <class... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  /// The wrapped module (its parameters hold shards outside forward/backward).
  M& module() { return module_; }
  const M& module() const { return module_; }

 private:
  M module_;
};

}  // namespace tdist::fsdp

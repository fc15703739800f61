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

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include "tdist/arg.h"
#include "tdist/comm/process_group.h"
#include "tdist/detail/util/sharded_tensor.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/full_params.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/state_dict.h"
#include "tdist/mesh/device_mesh.h"

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

/// Options a CustomPolicy may set for one wrapped module, overriding the root's (the keys of
/// the kwargs dict Python's CustomPolicy function returns that apply per unit on the
/// fully_shard core). Unset: the root's.
///  sharding_strategy : within the root's family: FULL_SHARD <-> SHARD_GRAD_OP,
///                      HYBRID_SHARD <-> HYBRID_SHARD_ZERO2 (every unit shards over the root's
///                      mesh); NO_SHARD only under NO_SHARD.
///  mixed_precision   : the unit's param / reduce dtypes and cast_forward_inputs; buffer_dtype
///                      must be unset or the root's (buffers are cast once, for the whole
///                      model).
///  cpu_offload       : the unit's offload policy.
struct FSDPUnitOptions {
  TDIST_ARG(std::optional<ShardingStrategy>, sharding_strategy) = std::nullopt;
  TDIST_ARG(std::optional<MixedPrecision>, mixed_precision) = std::nullopt;
  TDIST_ARG(std::optional<CPUOffload>, cpu_offload) = std::nullopt;

 public:
  /// No override set (Python's empty dict: the module is not wrapped).
  bool empty() const { return !sharding_strategy_ && !mixed_precision_ && !cpu_offload_; }
};

/// What a CustomPolicy function answers for one module, as Python's False / True / kwargs:
/// false (or empty FSDPUnitOptions) leaves it in its parent's unit; true wraps it with the
/// root's options; non-empty FSDPUnitOptions wrap it with those overriding the root's.
class CustomWrap {
 public:
  /*implicit*/ CustomWrap(bool wrap) : wrap_(wrap) {}
  /*implicit*/ CustomWrap(FSDPUnitOptions overrides)
      : wrap_(!overrides.empty()), overrides_(std::move(overrides)) {}
  bool wrap() const { return wrap_; }
  const FSDPUnitOptions& overrides() const { return overrides_; }

 private:
  bool wrap_;
  FSDPUnitOptions overrides_;
};

/// Python's CustomPolicy: `fn` is asked once for every module below the root (the root takes
/// the FSDPOptions; ignored and already sharded modules are not asked); the modules it wraps
/// get fully_shard bottom-up, e.g.
///   CustomPolicy([&](const torch::nn::Module& m) -> CustomWrap {
///     if (&m == model->head.get()) {
///       return FSDPUnitOptions().sharding_strategy(ShardingStrategy::SHARD_GRAD_OP);
///     }
///     return dynamic_cast<const BlockImpl*>(&m) != nullptr;
///   })
class CustomPolicy {
 public:
  using Fn = std::function<CustomWrap(const torch::nn::Module& module)>;
  explicit CustomPolicy(Fn fn) : fn_(std::move(fn)) {}
  const Fn& fn() const { return fn_; }

 private:
  Fn fn_;
};

/// FSDPOptions::auto_wrap_policy: a callable policy (AutoWrapPolicy, as the helpers above
/// return) or a CustomPolicy; empty: only the root is wrapped.
class WrapPolicy {
 public:
  WrapPolicy() = default;
  /*implicit*/ WrapPolicy(std::nullptr_t) {}
  /*implicit*/ WrapPolicy(AutoWrapPolicy policy) : callable_(std::move(policy)) {}
  /*implicit*/ WrapPolicy(CustomPolicy policy) : custom_(std::move(policy)) {}
  /// A lambda `(const Module&, bool recurse, int64_t nonwrapped_numel) -> bool`.
  template <class F, class = std::enable_if_t<
                         std::is_invocable_r_v<bool, F&, const torch::nn::Module&, bool, int64_t>>>
  /*implicit*/ WrapPolicy(F policy) : callable_(std::move(policy)) {}

  const AutoWrapPolicy& callable() const { return callable_; }
  const std::optional<CustomPolicy>& custom() const { return custom_; }
  explicit operator bool() const { return static_cast<bool>(callable_) || custom_.has_value(); }

 private:
  AutoWrapPolicy callable_;
  std::optional<CustomPolicy> custom_;
};

/// One entry of FSDPOptions::ignored_states (Python's ignored_states): a module (with all its
/// descendants) or a parameter.
class IgnoredState {
 public:
  /*implicit*/ IgnoredState(std::shared_ptr<torch::nn::Module> module)
      : state_(std::move(module)) {}
  template <class Impl, class = std::enable_if_t<std::is_base_of_v<torch::nn::Module, Impl>>>
  /*implicit*/ IgnoredState(std::shared_ptr<Impl> module)
      : state_(std::static_pointer_cast<torch::nn::Module>(std::move(module))) {}
  template <class Impl>
  /*implicit*/ IgnoredState(const torch::nn::ModuleHolder<Impl>& module)
      : state_(std::static_pointer_cast<torch::nn::Module>(module.ptr())) {}
  /*implicit*/ IgnoredState(at::Tensor parameter) : state_(std::move(parameter)) {}

  /// The module, or null for a parameter.
  const std::shared_ptr<torch::nn::Module>* module() const {
    return std::get_if<std::shared_ptr<torch::nn::Module>>(&state_);
  }
  /// The parameter, or null for a module.
  const at::Tensor* parameter() const { return std::get_if<at::Tensor>(&state_); }

 private:
  std::variant<std::shared_ptr<torch::nn::Module>, at::Tensor> state_;
};

/// A communication hook with its state bound (FullyShardedBase::register_comm_hook): `grad` is
/// an FSDP unit's flat gradient; sharded strategies pass `output`, this rank's shard to fill
/// (reduce-scattered and averaged); NO_SHARD passes it undefined: reduce `grad` in place.
using CommHook = std::function<void(const at::Tensor& grad, const at::Tensor& output)>;

struct FSDPOptions {
  /// Ranks to shard over (FULL_SHARD / SHARD_GRAD_OP). Default: the world. Not with
  /// device_mesh.
  TDIST_ARG(ProcessGroupPtr, process_group) = nullptr;
  /// The mesh: 1-D for FULL_SHARD / SHARD_GRAD_OP; 2-D (replicate, shard) for HYBRID_SHARD
  /// (and for NO_SHARD with a shard dimension of size 1). Default: built from the world.
  TDIST_ARG(std::optional<mesh::DeviceMesh>, device_mesh) = std::nullopt;
  TDIST_ARG(ShardingStrategy, sharding_strategy) = ShardingStrategy::FULL_SHARD;
  /// Which submodules get their own fully_shard (bottom-up): an AutoWrapPolicy callable or a
  /// CustomPolicy (per-module option overrides). Unset: only the root.
  TDIST_ARG(WrapPolicy, auto_wrap_policy) = nullptr;
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
  /// Python's ignored_states: modules or parameters left alone (all modules or all
  /// parameters, not mixed). Not with ignored_modules or ignored_parameters.
  TDIST_ARG(std::vector<IgnoredState>, ignored_states) = {};
  /// The device the module is moved to before sharding (its parameters and buffers on the
  /// CPU; not ignored ones), and the compute device: a CUDA device (device_id(i) is cuda:i;
  /// "cuda" without an index is the current device) or the CPU. Parameters already on another
  /// device are an error, as in PyTorch. Unset: the module stays where it is.
  TDIST_ARG(std::optional<c10::Device>, device_id) = std::nullopt;
  TDIST_ARG(std::optional<MixedPrecision>, mixed_precision) = std::nullopt;
  TDIST_ARG(std::optional<CPUOffload>, cpu_offload) = std::nullopt;

 public:
  /// device_id as Python's int: the CUDA device of that index.
  FSDPOptions& device_id(int index) {
    return device_id(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)));
  }
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
  /// Where the sharded parameters compute: device_id, or the device the module was on.
  const c10::Device& compute_device() const { return compute_device_; }
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

  /// FSDP1's register_comm_hook(state, hook): every FSDP unit reduces its gradients through
  /// `hook` instead: hook(*state, grad, output) for FULL_SHARD / SHARD_GRAD_OP, where grad is
  /// the unit's flat unsharded gradient (padded to world x shard; rank r's chunk is the part
  /// rank r keeps, as reduce_scatter_tensor takes it) and output this rank's shard, which the
  /// hook fills with the reduced, averaged gradient (default_hooks::reduce_scatter_hook);
  /// hook(*state, grad) or hook(*state, grad, undefined) for NO_SHARD, which reduces grad in
  /// place (default_hooks::allreduce_hook). The hook writes in place: grad and output keep
  /// their shape, dtype and storage (InvalidArgument otherwise). Once, on the root, before the
  /// first forward; not with hybrid strategies (as PyTorch). Unlike PyTorch, a sharded
  /// strategy at world 1 still passes output (PyTorch switches to NO_SHARD there).
  template <class State, class Hook>
  void register_comm_hook(std::shared_ptr<State> state, Hook hook) {
    constexpr bool with_output =
        std::is_invocable_v<Hook&, State&, const at::Tensor&, const at::Tensor&>;
    static_assert(with_output || std::is_invocable_v<Hook&, State&, const at::Tensor&>,
                  "register_comm_hook: the hook must be callable as hook(state, grad) or "
                  "hook(state, grad, output)");
    const bool has_state = state != nullptr;
    register_comm_hook_impl(
        [state = std::move(state), hook = std::move(hook)](const at::Tensor& grad,
                                                           const at::Tensor& output) mutable {
          if constexpr (with_output) {
            hook(*state, grad, output);
          } else {
            hook(*state, grad);
          }
        },
        with_output, has_state);
  }

 protected:
  std::shared_ptr<torch::nn::Module> module_ptr_;

 private:
  void register_comm_hook_impl(CommHook hook, bool takes_output, bool has_state);

  FSDPOptions options_;
  std::optional<mesh::DeviceMesh> mesh_;
  c10::Device compute_device_ = c10::Device(c10::DeviceType::CPU);
  bool comm_hook_registered_ = false;
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
  /// Another method of the module as the forward (as DistributedDataParallel's
  /// forward_method; tdist::fsdp::forward_method(module(), method, args...)).
  template <class Method, class... Args>
  auto forward_method(Method method, Args&&... args) {
    return tdist::fsdp::forward_method(module_, method, std::forward<Args>(args)...);
  }

  /// The wrapped module (its parameters hold shards outside forward/backward).
  M& module() { return module_; }
  const M& module() const { return module_; }

 private:
  M module_;
};

}  // namespace tdist::fsdp

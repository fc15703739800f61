#pragma once

// fully_shard: PyTorch FSDP2's per-parameter sharding for LibTorch modules.
//
//   for (auto& block : model->blocks) tdist::fsdp::fully_shard(block);   // each block...
//   tdist::fsdp::fully_shard(model);                                     // ...then the root
//   auto opt = torch::optim::AdamW(model->parameters(), ...);            // steps the shards
//   loss = tdist::fsdp::forward(model, x).mean(); loss.backward(); opt.step();
//
// and, inside the model's forward, each sharded block is called through FSDP:
//   x = tdist::fsdp::forward(block, x);          // was: x = block(x) / block->forward(x)
//
// Why a call-site wrapper: LibTorch modules have no forward hooks (pytorch#25888) and
// Module::forward is not virtual, so FSDP cannot intercept `block(x)`. See docs/fsdp.md.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "tdist/arg.h"
#include "tdist/comm/process_group.h"
#include "tdist/mesh/device_mesh.h"

namespace tdist::fsdp {

namespace detail {
class FSDPState;
}  // namespace detail

/// What happens to a module's parameters after its forward (FSDP2's reshard_after_forward).
///  true  : free them (ZeRO-3); backward all-gathers them again.
///  false : keep them unsharded until after backward (ZeRO-2: only grads and optimizer
///          state stay sharded between forward and backward).
///  int k : keep a 1/k shard over a group of k ranks (k divides the world; k = 1 is false,
///          k = world is true): backward all-gathers within that smaller group only.
class ReshardAfterForward {
 public:
  /*implicit*/ ReshardAfterForward(bool reshard) : group_size_(reshard ? 0 : 1) {}
  /*implicit*/ ReshardAfterForward(int group_size) : group_size_(group_size) {}
  /// 0 means "the whole group" (true); 1 means "do not reshard" (false).
  int group_size() const { return group_size_; }
  bool is_bool() const { return group_size_ <= 1; }

 private:
  int group_size_;
};

/// FSDP2's MixedPrecisionPolicy. Unset dtypes mean "the parameter's own dtype".
///  param_dtype  : dtype of the unsharded parameters: all-gathered and computed in it; the
///                 sharded (master) parameters and the optimizer state keep their dtype.
///  reduce_dtype : dtype gradients are reduced in (reduce-scatter, and the all-reduce across
///                 replicas with HSDP); default param_dtype. The sharded gradient is stored
///                 in the sharded parameter's dtype.
///  output_dtype : floating outputs of the module's forward are cast to it.
///  cast_forward_inputs : floating tensor inputs are cast to param_dtype before forward.
struct MixedPrecisionPolicy {
  TDIST_ARG(std::optional<c10::ScalarType>, param_dtype) = std::nullopt;
  TDIST_ARG(std::optional<c10::ScalarType>, reduce_dtype) = std::nullopt;
  TDIST_ARG(std::optional<c10::ScalarType>, output_dtype) = std::nullopt;
  TDIST_ARG(bool, cast_forward_inputs) = true;
};

/// FSDP2's OffloadPolicy: the default, no offloading.
class OffloadPolicy {
 public:
  OffloadPolicy() = default;
  /// True for CPUOffloadPolicy: sharded parameters, their gradients and so the optimizer
  /// state live in host memory; each module copies its shards to the compute device for the
  /// all-gather and its reduced gradients back. The optimizer steps on the host.
  bool offload_to_cpu() const { return offload_to_cpu_; }
  /// Page-locked host memory for the shards (only meaningful with CUDA).
  bool pin_memory() const { return pin_memory_; }

 protected:
  OffloadPolicy(bool offload, bool pin) : offload_to_cpu_(offload), pin_memory_(pin) {}

 private:
  bool offload_to_cpu_ = false;
  bool pin_memory_ = false;
};

/// FSDP2's CPUOffloadPolicy(pin_memory=True).
class CPUOffloadPolicy : public OffloadPolicy {
 public:
  explicit CPUOffloadPolicy(bool pin_memory = true) : OffloadPolicy(true, pin_memory) {}
};

struct FullyShardOptions {
  /// The mesh to shard over. Default: the world. A 1-D mesh shards over its group; a 2-D
  /// mesh (replicate, shard) is hybrid sharding (HSDP): parameters are sharded along dim 1
  /// and gradients, once reduce-scattered there, are all-reduced along dim 0.
  TDIST_ARG(std::optional<mesh::DeviceMesh>, mesh) = std::nullopt;
  /// Ranks to shard over, when no mesh is given. Default: the world group.
  TDIST_ARG(ProcessGroupPtr, process_group) = nullptr;
  TDIST_ARG(ReshardAfterForward, reshard_after_forward) = true;
  /// All-gathers allowed in flight at once (prefetches included); bounds memory. Taken from
  /// the root's options.
  TDIST_ARG(int, all_gather_limit) = 2;
  /// Prefetch the next module's all-gather in forward / the previous one's in backward.
  /// Taken from the root's options; false turns both directions off.
  TDIST_ARG(bool, prefetch) = true;
  /// Each direction on its own (FSDP1's forward_prefetch / backward_prefetch).
  TDIST_ARG(bool, forward_prefetch) = true;
  TDIST_ARG(bool, backward_prefetch) = true;
  TDIST_ARG(MixedPrecisionPolicy, mp_policy) = {};
  TDIST_ARG(OffloadPolicy, offload_policy) = {};
  /// Parameters left alone: not sharded, not reduced (each rank keeps its own copy, as
  /// FSDP2's ignored_params). Parameters with requires_grad=false are sharded but never
  /// reduced (frozen parameters may share a module with trainable ones).
  TDIST_ARG(std::vector<at::Tensor>, ignored_params) = {};
};

/// Per-module FSDP counters (see bench/fsdp).
/// Hook time is split four ways (Note [Hook time accounting] in src/fsdp/hook_timing.h);
/// summed over all modules of a tree, hook_cpu_ns + copy_ns + wait_ns + comm_issue_ns = the
/// wall time of FSDP's hooks (copies and collectives are charged to the module they serve,
/// which may differ from the one whose hook ran them, e.g. a prefetch).
struct FSDPStats {
  int64_t hook_cpu_ns = 0;    // the framework's own bookkeeping in FSDP's hooks: the hooks'
                              // time minus collectives (issue, wait) and data movement
  int64_t copy_ns = 0;        // data movement: allocating, copying, casting and freeing the
                              // collective buffers, unsharded storage and gradients
  int64_t wait_ns = 0;        // time blocked waiting for collectives
  int64_t comm_issue_ns = 0;  // time issuing collectives (handing them to the backend)
  int64_t hook_calls = 0;     // hook entry points run
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
  int64_t all_reduces = 0;  // HSDP: all-reduces of reduced gradients across replicas
  int64_t prefetches = 0;   // all-gathers issued ahead of the module's own hook
};

/// A handle on a module that fully_shard was applied to (FSDP2's FSDPModule).
/// FSDPModule::set_all_reduce_hook's hook: receives the reduced gradient shard (in place).
using AllReduceHook = std::function<void(const at::Tensor& reduce_output)>;

class FSDPModule {
 public:
  FSDPModule() = default;
  explicit FSDPModule(std::shared_ptr<detail::FSDPState> state) : state_(std::move(state)) {}

  /// All-gathers the parameters now (async_op: return at once; wait_for_unshard to finish).
  void unshard(bool async_op = false);
  void wait_for_unshard();
  /// Frees the unsharded parameters (they hold their shards again).
  void reshard();
  /// True when this module's parameters currently hold their full (unsharded) data.
  bool is_unsharded() const;
  /// Bytes of unsharded parameter storage held right now (0 when resharded).
  size_t unsharded_bytes() const;
  const FSDPStats& stats() const;
  void reset_stats();
  /// The module's name in the FSDP tree ("root" for the root, "blocks.0" ...).
  const std::string& label() const;

  /// False: backward computes gradients but does not reduce them; they accumulate
  /// unsharded on each rank until a backward with sync on (gradient accumulation without
  /// communication; FSDP2's set_requires_gradient_sync). recurse: also every fully_shard'ed
  /// module below this one.
  void set_requires_gradient_sync(bool requires_gradient_sync, bool recurse = true);
  bool requires_gradient_sync() const;
  /// Explicit prefetching (FSDP2): the modules whose all-gather this module issues at its
  /// pre-forward / pre-backward, replacing the recorded-order default for this module.
  void set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules);
  /// FSDP2's set_reshard_after_forward: free the unsharded parameters after forward (true)
  /// or keep them for backward (false: no all-gather in backward, more memory held). Between
  /// steps; recurse: also every fully_shard'ed module below. The root keeps its own
  /// parameters after forward either way (backward starts with it).
  void set_reshard_after_forward(bool reshard_after_forward, bool recurse = true);
  /// FSDP2's set_reshard_after_backward: false keeps the parameters unsharded after a
  /// backward with gradient sync off (set_requires_gradient_sync(false)), so the next
  /// microbatch's forward all-gathers nothing; more memory held between microbatches. A
  /// backward that reduces gradients reshards either way: its gradients belong to the shards
  /// the optimizer steps (Note [Unsharded after backward]). recurse: also every fully_shard'ed
  /// module below.
  void set_reshard_after_backward(bool reshard_after_backward, bool recurse = true);
  /// FSDP2's set_gradient_divide_factor: this module's reduced gradients are divided by
  /// `factor` instead of the data-parallel size (shard group x replicas), e.g. 1 for a loss
  /// summed, not averaged, over the global batch.
  void set_gradient_divide_factor(double factor);
  /// FSDP2's set_requires_all_reduce (HSDP): false skips the all-reduce across replicas; the
  /// reduce-scattered gradients are summed on this rank, and no gradient reaches the
  /// parameters, until a backward with it on all-reduces their sum (gradient accumulation
  /// with less communication). No effect without replicas. recurse: also every
  /// fully_shard'ed module below.
  void set_requires_all_reduce(bool requires_all_reduce, bool recurse = true);
  /// FSDP2's set_is_last_backward (called on any module of a tree, it sets the root's, as
  /// FSDP2's shared state does): false lets the next backward return with its
  /// last reduce-scatter still in flight, overlapping the next microbatch's forward; those
  /// gradients land at the start of the following backward. Set it back to true before the
  /// last microbatch: that backward returns with every gradient in place.
  void set_is_last_backward(bool is_last_backward);
  /// FSDP2's set_post_optim_event (on any module of a tree, for its root): the next forward's
  /// all-gather copy-ins wait for `event` (recorded by the caller after optimizer.step()) instead
  /// of for everything queued on the current stream, which may hold unrelated work; used once, then
  /// dropped, so set a new one every step. Without streams (the CPU) there is nothing to order and
  /// the event is dropped.
  void set_post_optim_event(std::shared_ptr<c10::Event> event);
  void set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules);
  /// FSDP2's set_all_reduce_hook: after this module's gradients are reduced (the
  /// reduce-scatter, and with HSDP the all-reduce across replicas), `hook` receives this
  /// rank's reduced gradient shard of the whole group (one flat tensor of the group's padded
  /// shard elements, in the reduce dtype), already divided as the gradients will be (the mean
  /// over the data-parallel ranks, or set_gradient_divide_factor, as PyTorch's averaging
  /// reduce-scatter gives it for float32 and bfloat16), and may change it in place before
  /// the gradients are installed from it: e.g. an all-reduce over a group FSDP does not
  /// know (replication done by hand). Not called by a backward that reduces nothing
  /// (gradient sync off, or set_requires_all_reduce(false) under HSDP). On an accelerator it
  /// runs with the reduce-scatter stream current. An empty hook removes it.
  void set_all_reduce_hook(AllReduceHook hook);
  /// FSDP2's set_unshard_in_backward: false skips this module's all-gather in backward, for
  /// an expert case: a module whose backward reads none of its parameters (an embedding's
  /// weight gradient needs only the ids). Its parameters take their full shape without
  /// data for autograd to accumulate their gradients into, which are reduced as usual; a
  /// backward that reads them reads storage that is not there. Default true.
  void set_unshard_in_backward(bool unshard_in_backward);

  detail::FSDPState& state() const;
  explicit operator bool() const { return static_cast<bool>(state_); }

 private:
  std::shared_ptr<detail::FSDPState> state_;
};

/// Shards `module`'s parameters that no nested fully_shard'ed module manages, in place. Apply
/// bottom-up: blocks first, then the root. Collective over the group: every rank must call
/// it in the same order with identically initialised modules, or with modules built on the
/// meta device, whose shards materialize then allocates and initialises (deferred_init.h). The
/// parameters stay the module's parameters() (now holding 1/N shards); build the optimizer after
/// this.
FSDPModule fully_shard(const std::shared_ptr<torch::nn::Module>& module,
                       const FullyShardOptions& options = {});

/// FSDP2's fully_shard([a, b]): one group (one all-gather, one reduce-scatter) for the
/// parameters of several modules, e.g. siblings too small to be worth a group each. The
/// forward of any of them unshards the group; each call reshards as reshard_after_forward
/// says (false keeps it unsharded from the first module's forward to backward), and the
/// gradients of all of them are reduced once per backward. Every FSDPModule handle of
/// them is the same. They must sit under a fully_shard'ed root.
FSDPModule fully_shard(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                       const FullyShardOptions& options = {});

template <class Impl>
FSDPModule fully_shard(const torch::nn::ModuleHolder<Impl>& module,
                       const FullyShardOptions& options = {}) {
  return fully_shard(std::static_pointer_cast<torch::nn::Module>(module.ptr()), options);
}

/// RAII form of set_requires_gradient_sync(false) over the whole tree below `module` (FSDP1's
/// no_sync()): restores the previous setting when it goes out of scope.
class NoSync {
 public:
  explicit NoSync(FSDPModule module);
  ~NoSync();
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  FSDPModule module_;
  bool previous_;
};

/// The handle of a module fully_shard was applied to; throws InvalidArgument otherwise.
FSDPModule fsdp_module(const torch::nn::Module& module);
/// True if fully_shard was applied to `module`.
bool is_fully_sharded(const torch::nn::Module& module);

}  // namespace tdist::fsdp

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
#include "tdist/fsdp/custom_comm.h"
#include "tdist/fsdp/policies.h"
#include "tdist/mesh/device_mesh.h"

namespace tdist::fsdp {

class FSDPModule;
namespace detail {
class FSDPState;
/// The library's own access to a handle's state (its type lives in src/fsdp).
FSDPState& state_of(const FSDPModule& module);
}  // namespace detail

/// A handle on a module that fully_shard was applied to (FSDP2's FSDPModule).
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
  /// FSDP2's set_custom_all_gather / set_custom_reduce_scatter (tdist/fsdp/custom_comm.h):
  /// this module's all-gathers / gradient reduce-scatters are allocated and run by `comm`
  /// (null: FSDP's own again). Between steps, on every rank alike.
  void set_custom_all_gather(std::shared_ptr<AllGather> comm);
  void set_custom_reduce_scatter(std::shared_ptr<ReduceScatter> comm);

  explicit operator bool() const { return static_cast<bool>(state_); }
  /// Handles of one fully_shard call compare equal.
  bool operator==(const FSDPModule& other) const { return state_ == other.state_; }
  bool operator!=(const FSDPModule& other) const { return state_ != other.state_; }

 private:
  friend detail::FSDPState& detail::state_of(const FSDPModule& module);
  detail::FSDPState& state() const;

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

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

#include <memory>
#include <optional>
#include <string>

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

struct FullyShardOptions {
  /// The 1-D mesh to shard over (2-D HSDP meshes: see issue 6). Default: the world.
  TDIST_ARG(std::optional<mesh::DeviceMesh>, mesh) = std::nullopt;
  /// Ranks to shard over, when no mesh is given. Default: the world group.
  TDIST_ARG(ProcessGroupPtr, process_group) = nullptr;
  TDIST_ARG(ReshardAfterForward, reshard_after_forward) = true;
  /// All-gathers allowed in flight at once (prefetches included); bounds memory. Taken from
  /// the root's options.
  TDIST_ARG(int, all_gather_limit) = 2;
  /// Prefetch the next module's all-gather in forward / the previous one's in backward.
  /// Taken from the root's options.
  TDIST_ARG(bool, prefetch) = true;
};

/// Per-module FSDP counters (see bench/fsdp).
struct FSDPStats {
  int64_t hook_cpu_ns = 0;  // time in FSDP's hooks, excluding waits on collectives
  int64_t wait_ns = 0;      // time blocked waiting for collectives
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
  int64_t prefetches = 0;  // all-gathers issued ahead of the module's own hook
};

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
  /// The module's name in the FSDP tree ("" for the root, "blocks.0" ...).
  const std::string& label() const;

  detail::FSDPState& state() const;
  explicit operator bool() const { return static_cast<bool>(state_); }

 private:
  std::shared_ptr<detail::FSDPState> state_;
};

/// Shards `module`'s parameters that no nested fully_shard'ed module manages, in place. Apply
/// bottom-up: blocks first, then the root. Collective over the group: every rank must call
/// it in the same order with identically initialised modules. The parameters stay the
/// module's parameters() (now holding 1/N shards); build the optimizer after this.
FSDPModule fully_shard(const std::shared_ptr<torch::nn::Module>& module,
                       const FullyShardOptions& options = {});

template <class Impl>
FSDPModule fully_shard(const torch::nn::ModuleHolder<Impl>& module,
                       const FullyShardOptions& options = {}) {
  return fully_shard(std::static_pointer_cast<torch::nn::Module>(module.ptr()), options);
}

/// The handle of a module fully_shard was applied to; throws InvalidArgument otherwise.
FSDPModule fsdp_module(const torch::nn::Module& module);
/// True if fully_shard was applied to `module`.
bool is_fully_sharded(const torch::nn::Module& module);

}  // namespace tdist::fsdp

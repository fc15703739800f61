#pragma once

// fully_shard's options and the value types they hold (FSDP2's MixedPrecisionPolicy,
// OffloadPolicy, reshard_after_forward), and FSDP's counters. fully_shard.h includes this
// header; FSDP's internals include it alone.

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "tdist/arg.h"
#include "tdist/comm/process_group.h"
#include "tdist/mesh/device_mesh.h"
#include "tdist/tensor/placement.h"

namespace tdist::fsdp {

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
  /// FSDP2's shard_placement_fn: called for each parameter this call manages with its name
  /// (relative to the module given to fully_shard) and the parameter; returns the dim to
  /// shard it on, tensor::Shard(d) (negative d counts from the end), or nullopt for dim 0.
  /// Uneven sizes are padded along d, as along dim 0 (PyTorch 2.11 refuses them for d > 0);
  /// at rest the parameter is its slice along d (Note [Sharding on another dim]).
  using ShardPlacementFn =
      std::function<std::optional<tensor::Shard>(const std::string& name, const at::Tensor&)>;
  TDIST_ARG(ShardPlacementFn, shard_placement_fn) = nullptr;
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

/// FSDPModule::set_all_reduce_hook's hook: receives the reduced gradient shard (in place).
using AllReduceHook = std::function<void(const at::Tensor& reduce_output)>;

}  // namespace tdist::fsdp

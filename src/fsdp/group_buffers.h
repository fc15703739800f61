#pragma once

// GroupBuffers: where a ParamGroup's collectives get their memory and how its parameters'
// data moves in and out of them. ParamGroup keeps the lifecycle (which verb may run when,
// param_group.cpp); a GroupBuffers does the data movement of each step of it:
//
//   start_all_gather ─▶ (wait all_gather_work) ─▶ finish_all_gather ─▶ ... ─▶ free_unsharded
//   start_reduce_scatter ─▶ (wait reduce_scatter_work) ─▶ install_reduced_grads | drop_reduced
//
// Two implementations, chosen per group at fully_shard (make_group_buffers):
//  - PerCallBuffers (per_call_buffers.h): every collective allocates its buffers and copies
//    each parameter in and out with ATen ops. Any device, any dtype, mixed precision.
//  - PersistentBuffers (persistent_buffers.h): Note [Persistent buffers] in flat_collectives.h;
//    plain CPU groups in the parameters' own dtype.
// On an accelerator, PerCallBuffers runs its copies and collectives on the device's FSDP
// streams (Note [FSDP streams] in device_streams.h).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "fsdp/collectives.h"
#include "tdist/comm/process_group.h"
#include "tdist/comm/work.h"
#include "tdist/fsdp/policies.h"

namespace tdist::fsdp::detail {

class DeviceStreams;
class ShardedParam;

/// How a group communicates, fixed at fully_shard time.
struct GroupConfig {
  ReshardAfterForward reshard_after_forward = true;
  ProcessGroupPtr post_forward_group;           // the k-rank group of an integer reshard
  ProcessGroupPtr replicate_group;              // HSDP: gradients all-reduced across it after the
                                                // reduce-scatter (null: no replication)
  std::optional<c10::ScalarType> reduce_dtype;  // default: the unsharded dtype
  at::Tensor flat_shard;           // the params' padded shards already live here (fully_shard)
  bool symmetric_buffers = false;  // pooled buffers in symmetric memory (agreed by all ranks)
  bool placed_all_gather = false;  // FSDPEnvironment::placed_all_gather, for the flat shard
};

/// The names a group's collectives carry (trace scopes, the flight recorder).
struct GroupLabels {
  std::string module;          // the module's label
  std::string all_gather;      // "<module> all_gather"
  std::string reduce_scatter;  // "<module> reduce_scatter"
};

/// What a group's buffers work on; owned by the ParamGroup, which outlives its buffers.
struct GroupBuffersContext {
  const std::vector<ShardedParam*>& params;
  std::shared_ptr<const FlatLayout> layout;  // shared with placed all-gathers
  const ProcessGroupPtr& group;              // the shard group
  const GroupLabels& labels;
  FSDPStats& stats;
  DeviceStreams* streams;  // the compute device's (Note [FSDP streams]); null on the CPU
  const ReduceHook& reduce_hook;  // when set, reduces in place of the reduce-scatter
  const CustomComms& custom_comms;  // Note [Custom collectives]; PerCallBuffers only
};

class GroupBuffers {
 public:
  virtual ~GroupBuffers() = default;

  /// Issues the all-gather of this rank's shards over the shard group, or, when `slab` is
  /// defined, of a post-forward slab over `slab_group` (Note [Reshard to a smaller group]).
  /// `inputs_ordered`: the copy-in stream already waited for the last writes of the shards
  /// (Note [FSDP streams]); the copy-in then needs no wait of its own.
  virtual void start_all_gather(const at::Tensor& slab, const ProcessGroupPtr& slab_group,
                                bool inputs_ordered) = 0;
  /// The all-gather in flight (null when none).
  virtual const WorkPtr& all_gather_work() const = 0;
  /// Once all_gather_work() completed: every parameter's unsharded tensor holds the gathered
  /// data (the caller then points the parameters at it).
  virtual void finish_all_gather() = 0;
  /// Frees the unsharded data (the parameters already point at their shards).
  virtual void free_unsharded() = 0;
  /// Bytes held by the unsharded data now.
  virtual size_t unsharded_bytes() const = 0;

  /// Copies `grads` (per parameter; undefined: zeros) in and issues the reduce-scatter
  /// (SUM) over the shard group, in `reduce_dtype`, or runs the context's reduce hook
  /// (Note [Reduce hook]).
  virtual void start_reduce_scatter(const std::vector<at::Tensor>& grads,
                                    c10::ScalarType reduce_dtype) = 0;
  virtual const WorkPtr& reduce_scatter_work() const = 0;
  /// This rank's summed shards ([total]) once reduce_scatter_work() completed; HSDP
  /// all-reduces it in place.
  virtual at::Tensor& reduce_output() = 0;
  /// Divides the output by `divisor` and installs it as the parameters' sharded gradients
  /// (added onto their stashes); frozen parameters get their stash back.
  virtual void install_reduced_grads(double divisor) = 0;
  /// Releases the reduce-scatter's buffers without installing anything (the caller has
  /// taken the output's sum, Note [Accumulation without all-reduce]).
  virtual void drop_reduced() = 0;
};

/// PersistentBuffers when fully_shard gave the group a flat shard (config.flat_shard, which
/// it takes), else PerCallBuffers.
std::unique_ptr<GroupBuffers> make_group_buffers(const GroupBuffersContext& context,
                                                 GroupConfig& config);

}  // namespace tdist::fsdp::detail

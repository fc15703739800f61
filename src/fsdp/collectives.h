#pragma once

// FSDP's collectives over a group of ShardedParams, as FSDP2's _fsdp_collectives: each call
// copies in, issues one asynchronous collective and returns a record of what is in flight
// (its buffers and Work), which the caller (ParamGroup) keeps until the matching copy-out
// finishes it. What is in flight lives in those records and in the caller's buffers; the
// functions themselves keep nothing between calls (their counters go to the FSDPStats given).
//
// Note [Flat buffer layout]
// A group's all-gather input on rank r is the concatenation of its params' padded shards
// (total = sum of padded_shard_numel elements). The output is world * total elements,
// rank-major: [rank 0: p0 shard, p1 shard, ...][rank 1: ...]. Viewed as [world, total], the
// column range of param i, [offset_i, offset_i + n_i), reshaped to [world * n_i] is exactly
// param i's padded unsharded tensor (Note [Dim-0 padding]). Reduce-scatter uses the same
// layout for its input, so rank r receives the sum of every rank's column block r.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "tdist/comm/process_group.h"
#include "tdist/comm/work.h"
#include "tdist/fsdp/custom_comm.h"
#include "tdist/fsdp/policies.h"

namespace tdist::fsdp::detail {

class DeviceStreams;
class ShardedParam;

/// Column offsets of each param in the flat layout, and the total.
struct FlatLayout {
  std::vector<int64_t> offsets;
  std::vector<int64_t> numels;
  int64_t total = 0;
  static FlatLayout of(const std::vector<ShardedParam*>& params);
};

// Note [Custom collectives]
// FSDPModule::set_custom_all_gather / set_custom_reduce_scatter hand a group's collectives to
// user code, which allocates their buffers too (FSDP2's Comm). As in PyTorch, the all-gather's
// input is then a view of its output (this rank's block, so the collective runs in place) and
// the reduce-scatter's input and output both come from allocate; FSDP copies in and out and
// divides exactly as around its own collectives. The comm is called at every world size
// (also 1) and on every rank, so its collectives pair up. Only the general buffers
// (PerCallBuffers) run them: setting one moves a group off persistent buffers.
struct CustomComms {
  std::shared_ptr<AllGather> all_gather;
  std::shared_ptr<ReduceScatter> reduce_scatter;
};

struct AllGatherResult {
  WorkPtr work;
  at::Tensor output;  // [world * total]
  at::Tensor input;   // kept alive until the work completes
  int world = 1;
};

/// All-gathers the params' padded shards. `input` may be given (a post-forward slab, see
/// Note [Reshard to a smaller group]); by default the shards are copied into one buffer.
/// `stats` gets the copy-in (copy_ns) and the issue (comm_issue_ns) time. With `streams`
/// (an accelerator), the copy-in and the issue run on the copy-in stream, after the compute
/// stream when `wait_for_compute` (Note [FSDP streams]). A `custom` comm allocates and runs
/// it (Note [Custom collectives]).
AllGatherResult foreach_all_gather(const std::vector<ShardedParam*>& params,
                                   const FlatLayout& layout, const ProcessGroupPtr& group,
                                   const std::string& label, FSDPStats& stats,
                                   DeviceStreams* streams, bool wait_for_compute,
                                   at::Tensor input = {}, AllGather* custom = nullptr);

/// Copies a completed all-gather's output into each param's (allocated) padded unsharded
/// tensor.
void foreach_all_gather_copy_out(const AllGatherResult& result,
                                 const std::vector<ShardedParam*>& params,
                                 const FlatLayout& layout);

// Note [Reduce hook]
// A group's gradient reduction may be handed to a function (FSDP1's register_comm_hook):
// called with the flat reduce-scatter input ([world * total] of the shard group, rank-major,
// Note [Flat buffer layout]) and this rank's output ([total]), it runs the communication and
// its averaging itself, synchronously, in place of the reduce-scatter, and, when the group
// has replicas (HSDP, a NO_SHARD mesh), in place of their all-reduce too: finish_reduce
// installs its output undivided. It runs on every rank for every reduce, with zeros from a
// joined rank (Note [Join replay]), so its collectives pair up.
using ReduceHook = std::function<void(const at::Tensor& input, const at::Tensor& output)>;

struct ReduceScatterResult {
  WorkPtr work;
  at::Tensor output;           // [total], this rank's summed shards
  at::Tensor input;            // kept alive until the work completes
  std::vector<bool> has_grad;  // per param: did any gradient arrive on this rank
  int world = 1;
};

/// Reduce-scatters unsharded gradients (undefined = zeros) into this rank's shards, in
/// `reduce_dtype` (MixedPrecisionPolicy::reduce_dtype). With `streams`, the copy-in runs on
/// the compute stream and the issue on the reduce-scatter stream (Note [FSDP streams]). A
/// set `hook` reduces instead (Note [Reduce hook]); else a `custom` comm allocates and runs
/// the reduce-scatter (Note [Custom collectives]).
ReduceScatterResult foreach_reduce(const std::vector<ShardedParam*>& params,
                                   const std::vector<at::Tensor>& unsharded_grads,
                                   const FlatLayout& layout, const ProcessGroupPtr& group,
                                   const std::string& label, c10::ScalarType reduce_dtype,
                                   FSDPStats& stats, DeviceStreams* streams,
                                   const ReduceHook& hook = nullptr,
                                   ReduceScatter* custom = nullptr);

/// All-gathers a tensor sliced like `param` (`local`: this rank's unpadded rows, in any
/// dtype) into the whole tensor, synchronously, over `group`, on the compute device. Returns
/// [dim0, ...] viewing a padded buffer (summon_full_params and full state dicts).
at::Tensor all_gather_whole(const at::Tensor& local, const ShardedParam& param,
                            const ProcessGroupPtr& group);

/// The reduced, averaged shard gradient of param i ([local_rows, ...]) from a completed
/// reduce-scatter: a view into result.output.
at::Tensor reduced_shard_grad(const ReduceScatterResult& result, const ShardedParam& param,
                              int64_t offset);

/// Runs `hook` (Note [Reduce hook]) on `input` and `output`; returns the completed Work the
/// reduce-scatter would have returned.
WorkPtr run_reduce_hook(const ReduceHook& hook, const at::Tensor& output, const at::Tensor& input,
                        const std::string& label, FSDPStats& stats);

}  // namespace tdist::fsdp::detail

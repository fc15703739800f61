#pragma once

// The collectives and raw copies of the persistent path (persistent_buffers.h), over a
// group's flat layout (Note [Flat buffer layout], collectives.h).
//
// Note [Persistent buffers]
// The fast path of a group whose params are plain CPU tensors computed in their own dtype:
// the group's padded shards are views of ONE flat buffer in the all-gather input layout (no
// copy-in), the collective buffers keep one StorageImpl each across steps with their bytes
// from the BufferPool, and the copies are plain memcpy over raw pointers (no dispatcher, no
// per-parameter tensor views).

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp/collectives.h"
#include "tdist/comm/process_group.h"
#include "tdist/comm/work.h"
#include "tdist/fsdp/policies.h"

namespace tdist::fsdp::detail {

/// Issues the all-gather of `input` ([total], this rank's block) into `output`
/// ([world * total]); a group of one copies.
WorkPtr issue_all_gather(const at::Tensor& output, const at::Tensor& input,
                         const ProcessGroupPtr& group, const std::string& label, FSDPStats& stats);

/// Note [Placed all-gather] (tdist/detail/comm/placed_all_gather.h): whether
/// issue_all_gather_placed can run on `group` for `input` (a group of one always can).
bool can_all_gather_placed(const at::Tensor& input, const ProcessGroupPtr& group);

/// Issues the all-gather of `input` ([total], this rank's block) straight into the
/// param-major `unsharded` block (copy_out_rank_block for every rank, on the collective's
/// thread); `unsharded` must outlive the returned Work. The placer shares `layout`, so it
/// stays valid when the caller is gone before the collective runs (a ParamGroup destroyed
/// mid-step leaks the block, Note [Abandoned placed all-gather]).
WorkPtr issue_all_gather_placed(char* unsharded, const at::Tensor& input,
                                std::shared_ptr<const FlatLayout> layout,
                                const ProcessGroupPtr& group, const std::string& label,
                                FSDPStats& stats);

/// Copies rank `rank`'s block of the flat layout ([total] elements) into the param-major
/// unsharded block: param i's padded unsharded tensor is world * numels[i] elements at
/// world * offsets[i], rank r's rows at r * numels[i] of it.
void copy_out_rank_block(const char* block, char* unsharded, const FlatLayout& layout, int world,
                         int rank, size_t element_size);

/// copy_out_rank_block for every rank's block of the rank-major all-gather output.
void copy_out_flat(const char* gathered, char* unsharded, const FlatLayout& layout, int world,
                   size_t element_size);

/// Fills the rank-major reduce-scatter input [world, total] from the unsharded gradients
/// (undefined: zeros; padding rows: zeros); memcpy for contiguous CPU grads of the input's
/// dtype, ATen copies otherwise.
void copy_in_grads(const at::Tensor& input, const std::vector<ShardedParam*>& params,
                   const std::vector<at::Tensor>& grads, const FlatLayout& layout);

/// Issues the reduce-scatter (SUM) of `input` ([world * total]) into `output` ([total]); a
/// set `hook` reduces instead (Note [Reduce hook]).
WorkPtr issue_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                             const ProcessGroupPtr& group, const std::string& label,
                             FSDPStats& stats, const ReduceHook& hook = nullptr);

}  // namespace tdist::fsdp::detail

#include "fsdp/flat_collectives.h"

#include <cstring>

#include <ATen/ATen.h>

#include "fsdp/hook_timing.h"
#include "fsdp/sharded_param.h"
#include "fsdp/trace_scope.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/flight_recorder.h"
#include "tdist/detail/comm/placed_all_gather.h"

namespace tdist::fsdp::detail {

namespace {

// Issues `collective` (async) on a real group, timed as issuing; a group of one has nothing
// to exchange, so output (as many bytes as input there) is a copy of input.
template <typename Collective>
WorkPtr issue_flat(const char* name, const at::Tensor& output, const at::Tensor& input,
                   const ProcessGroupPtr& group, const std::string& label, FSDPStats& stats,
                   Collective&& collective) {
  if (group->size() == 1) {
    {
      CopyTimer copy(stats);
      // An empty buffer's data pointer may be null, which memcpy must not get.
      if (output.nbytes() > 0) std::memcpy(output.data_ptr(), input.data_ptr(), output.nbytes());
    }
    CommTimer issue(stats.comm_issue_ns);
    return completed_work(name, {output});
  }
  CommTimer issue(stats.comm_issue_ns);
  CollectiveLabelScope label_scope(label);
  return collective();
}

}  // namespace

WorkPtr issue_all_gather(const at::Tensor& output, const at::Tensor& input,
                         const ProcessGroupPtr& group, const std::string& label, FSDPStats& stats) {
  return issue_flat("all_gather_into_tensor", output, input, group, label, stats, [&] {
    return all_gather_into_tensor(output, input, group, /*async_op=*/true);
  });
}

bool can_all_gather_placed(const at::Tensor& input, const ProcessGroupPtr& group) {
  return group->size() == 1 || supports_all_gather_placed(input, group);
}

WorkPtr issue_all_gather_placed(char* unsharded, const at::Tensor& input,
                                std::shared_ptr<const FlatLayout> layout,
                                const ProcessGroupPtr& group, const std::string& label,
                                FSDPStats& stats) {
  const int world = group->size();
  const size_t element_size = input.element_size();
  if (world == 1) {
    {
      CopyTimer copy(stats);
      copy_out_rank_block(static_cast<const char*>(input.data_ptr()), unsharded, *layout, 1, 0,
                          element_size);
    }
    CommTimer issue(stats.comm_issue_ns);
    return completed_work("all_gather_into_tensor", {});
  }
  CommTimer issue(stats.comm_issue_ns);
  CollectiveLabelScope label_scope(label);
  return all_gather_placed(
      input,
      [unsharded, layout = std::move(layout), world, element_size](int rank, const char* block) {
        copy_out_rank_block(block, unsharded, *layout, world, rank, element_size);
      },
      group);
}

void copy_out_rank_block(const char* block, char* unsharded, const FlatLayout& layout, int world,
                         int rank, size_t element_size) {
  for (size_t i = 0; i < layout.offsets.size(); ++i) {
    const size_t n = static_cast<size_t>(layout.numels[i]) * element_size;
    const size_t off = static_cast<size_t>(layout.offsets[i]) * element_size;
    std::memcpy(unsharded + off * static_cast<size_t>(world) + static_cast<size_t>(rank) * n,
                block + off, n);
  }
}

void copy_out_flat(const char* gathered, char* unsharded, const FlatLayout& layout, int world,
                   size_t element_size) {
  const size_t row = static_cast<size_t>(layout.total) * element_size;
  for (int r = 0; r < world; ++r) {
    copy_out_rank_block(gathered + r * row, unsharded, layout, world, r, element_size);
  }
}

void copy_in_grads(const at::Tensor& input, const std::vector<ShardedParam*>& params,
                   const std::vector<at::Tensor>& grads, const FlatLayout& layout) {
  const size_t esz = input.element_size();
  const int world = params.front()->layout().world;
  char* base = static_cast<char*>(input.data_ptr());
  const size_t rank_bytes = static_cast<size_t>(layout.total) * esz;
  for (size_t i = 0; i < params.size(); ++i) {
    const ShardLayout& pl = params[i]->layout();
    const at::Tensor& grad = grads[i];
    const size_t shard_bytes = static_cast<size_t>(pl.padded_shard_numel()) * esz;
    const size_t row_bytes = static_cast<size_t>(pl.row_numel) * esz;
    char* dst = base + static_cast<size_t>(layout.offsets[i]) * esz;
    if (!grad.defined()) {
      for (int r = 0; r < world; ++r) std::memset(dst + r * rank_bytes, 0, shard_bytes);
      continue;
    }
    if (grad.is_cpu() && grad.is_contiguous() && grad.scalar_type() == input.scalar_type() &&
        grad.numel() == pl.numel()) {
      const char* src = static_cast<const char*>(grad.data_ptr());
      for (int r = 0; r < world; ++r) {
        const int64_t first = r * pl.shard_rows;
        const int64_t count = std::max<int64_t>(0, std::min(pl.shard_rows, pl.dim0 - first));
        const size_t bytes = static_cast<size_t>(count) * row_bytes;
        if (bytes > 0) std::memcpy(dst + r * rank_bytes, src + first * row_bytes, bytes);
        if (bytes < shard_bytes) std::memset(dst + r * rank_bytes + bytes, 0, shard_bytes - bytes);
      }
      continue;
    }
    // Strided, other dtype or device: ATen copies into [world, shard_rows, row_numel].
    at::Tensor block = input.view({world, layout.total})
                           .narrow(1, layout.offsets[i], layout.numels[i])
                           .view({world, pl.shard_rows, pl.row_numel});
    block.zero_();
    const at::Tensor rows = grad.reshape({pl.dim0, pl.row_numel});
    for (int r = 0; r < world; ++r) {
      const int64_t first = r * pl.shard_rows;
      const int64_t count = std::min<int64_t>(pl.shard_rows, pl.dim0 - first);
      if (count <= 0) break;
      block.select(0, r).narrow(0, 0, count).copy_(rows.narrow(0, first, count));
    }
  }
}

WorkPtr issue_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                             const ProcessGroupPtr& group, const std::string& label,
                             FSDPStats& stats, const ReduceHook& hook) {
  if (hook) return run_reduce_hook(hook, output, input, label, stats);
  return issue_flat("reduce_scatter_tensor", output, input, group, label, stats, [&] {
    return reduce_scatter_tensor(output, input, ReduceOp::SUM, group, /*async_op=*/true);
  });
}

}  // namespace tdist::fsdp::detail

#include "fsdp/collectives.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>

#include "fsdp/device_streams.h"
#include "fsdp/hook_timing.h"
#include "fsdp/sharded_param.h"
#include "fsdp/trace_scope.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/flight_recorder.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {

FlatLayout FlatLayout::of(const std::vector<ShardedParam*>& params) {
  FlatLayout layout;
  for (ShardedParam* p : params) {
    layout.offsets.push_back(layout.total);
    layout.numels.push_back(p->layout().padded_shard_numel());
    layout.total += p->layout().padded_shard_numel();
  }
  return layout;
}

namespace {

/// `comm.allocate` with its result checked: a wrong buffer is named here, not as a crash or
/// silent corruption in the collective.
at::Tensor allocate_checked(Comm& comm, int64_t numel, const at::TensorOptions& options,
                            const std::string& what, const std::string& label) {
  const c10::ScalarType dtype = options.dtype().toScalarType();
  at::Tensor buffer = comm.allocate({numel}, dtype, options.device());
  const bool ok = buffer.defined() && buffer.dim() == 1 && buffer.numel() == numel &&
                  buffer.scalar_type() == dtype && buffer.device() == options.device() &&
                  buffer.is_contiguous();
  if (!ok) {
    std::string got = "an undefined tensor";
    if (buffer.defined()) {
      got = std::string(c10::toString(buffer.scalar_type())) + " " + c10::str(buffer.sizes()) +
            " on " + buffer.device().str() + (buffer.is_contiguous() ? "" : " (not contiguous)");
    }
    TDIST_THROW(InvalidArgument, "FSDP: the custom " + what + " of '" + label + "' allocated " +
                                     got + "; it must return a contiguous " + c10::toString(dtype) +
                                     " [" + std::to_string(numel) + "] on " +
                                     options.device().str());
  }
  return buffer;
}

WorkPtr completed_if_null(WorkPtr work, const char* name, const at::Tensor& output) {
  return work ? std::move(work) : completed_work(name, {output});
}

}  // namespace

AllGatherResult foreach_all_gather(const std::vector<ShardedParam*>& params,
                                   const FlatLayout& layout, const ProcessGroupPtr& group,
                                   const std::string& label, FSDPStats& stats,
                                   DeviceStreams* streams, bool wait_for_compute, at::Tensor input,
                                   AllGather* custom) {
  TraceScope trace("FSDP::all_gather", label);
  // Note [FSDP streams]: after what the compute stream has queued (the inputs' last writes),
  // unless the root's pre-forward ordered the copy-in stream after them already.
  if (streams != nullptr && wait_for_compute) {
    streams->wait(StreamRole::kAllGatherCopyIn, StreamRole::kCompute);
  }
  StreamScope on_copy_in(streams, StreamRole::kAllGatherCopyIn);
  AllGatherResult result;
  result.world = params.empty() ? 1 : params.front()->layout().world;
  // Note [Mixed precision and offload]: gathered in param_dtype on the compute device.
  const at::TensorOptions options = params.front()->unsharded_options();
  {
    CopyTimer copy(stats);
    if (custom != nullptr) {
      result.output =
          allocate_checked(*custom, result.world * layout.total, options, "all-gather", label);
    }
    if (!input.defined()) {
      TraceScope copy_in("FSDP::all_gather_copy_in", label);
      // Note [Custom collectives]: in place, this rank's block of the output.
      input = custom != nullptr
                  ? result.output.narrow(0, group->rank() * layout.total, layout.total)
                  : at::empty({layout.total}, options);
      std::vector<at::Tensor> blocks, shards;
      bool all_pinned = true;
      for (size_t i = 0; i < params.size(); ++i) {
        blocks.push_back(input.narrow(0, layout.offsets[i], layout.numels[i]));
        shards.push_back(params[i]->padded_shard_flat());
        all_pinned = all_pinned && params[i]->shard_options().pinned_memory();
      }
      // One multi-tensor copy on a GPU (FSDP2's copy-in), not a kernel per parameter. Pinned
      // offloaded shards go host-to-device without blocking the host.
      at::_foreach_copy_(blocks, shards, /*non_blocking=*/all_pinned);
    }
    result.input = input;
    if (custom == nullptr) {
      result.output = at::empty({result.world * layout.total}, options);
      if (group->size() == 1) result.output.copy_(input);
    }
  }
  CommTimer issue(stats.comm_issue_ns);
  if (custom != nullptr) {
    CollectiveLabelScope label_scope(label + " all_gather");
    result.work = completed_if_null((*custom)(result.output, input, group, /*async_op=*/true),
                                    "all_gather_into_tensor", result.output);
  } else if (group->size() == 1) {
    result.work = completed_work("all_gather_into_tensor", {result.output});
  } else {
    // The flight recorder names the FSDP module a stuck rank was gathering for.
    CollectiveLabelScope label_scope(label + " all_gather");
    result.work = all_gather_into_tensor(result.output, input, group, /*async_op=*/true);
  }
  return result;
}

void foreach_all_gather_copy_out(const AllGatherResult& result,
                                 const std::vector<ShardedParam*>& params,
                                 const FlatLayout& layout) {
  const at::Tensor blocks = result.output.view({result.world, layout.total});
  // Note [Flat buffer layout]: column block i, row-major, is the padded unsharded param. One
  // split-and-copy (a single kernel on a GPU, as FSDP2's copy-out), not a copy per parameter.
  std::vector<at::Tensor> unsharded;
  for (size_t i = 0; i < params.size(); ++i) {
    unsharded.push_back(params[i]->padded_unsharded().view({result.world, layout.numels[i]}));
  }
  at::split_with_sizes_copy_out(unsharded, blocks, layout.numels, /*dim=*/1);
}

namespace {

// Whether at::_chunk_cat lays these gradients out as the reduce-scatter input wants them:
// every one present, of the input's dtype and device, at least one-dimensional, and shaped
// as its parameter. _chunk_cat pads dim 0 with zeros to a multiple of the world and puts
// chunk r of every gradient, in order, into row r: rank r's padded shards (Note [Dim-0
// padding]), in one kernel on a GPU (FSDP2's reduce-scatter copy-in).
bool chunk_cat_applies(const std::vector<ShardedParam*>& params,
                       const std::vector<at::Tensor>& grads, const at::Tensor& input) {
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = grads[i];
    const ShardLayout& pl = params[i]->layout();
    if (!g.defined() || g.dim() == 0 || pl.shard_dim != 0 ||
        g.scalar_type() != input.scalar_type() || g.device() != input.device() ||
        g.size(0) != pl.dim0 || g.numel() != pl.numel() || g.numel() == 0) {
      return false;
    }
  }
  return !params.empty();
}

}  // namespace

ReduceScatterResult foreach_reduce(const std::vector<ShardedParam*>& params,
                                   const std::vector<at::Tensor>& unsharded_grads,
                                   const FlatLayout& layout, const ProcessGroupPtr& group,
                                   const std::string& label, c10::ScalarType reduce_dtype,
                                   FSDPStats& stats, DeviceStreams* streams, const ReduceHook& hook,
                                   ReduceScatter* custom) {
  TraceScope trace("FSDP::reduce_scatter", label);
  CopyTimer copy(stats);
  ReduceScatterResult result;
  result.world = params.front()->layout().world;
  const at::TensorOptions options = params.front()->unsharded_options().dtype(reduce_dtype);
  if (hook) custom = nullptr;  // the reduce hook replaces the whole reduction
  result.input = custom != nullptr ? allocate_checked(*custom, result.world * layout.total, options,
                                                      "reduce-scatter", label)
                                         .view({result.world, layout.total})
                                   : at::empty({result.world, layout.total}, options);
  result.has_grad.resize(params.size(), false);
  if (chunk_cat_applies(params, unsharded_grads, result.input)) {
    TraceScope copy_in("FSDP::reduce_scatter_copy_in", label);
    at::_chunk_cat_out(result.input, unsharded_grads, /*dim=*/0, /*num_chunks=*/result.world);
    result.has_grad.assign(params.size(), true);
  } else {
    TraceScope copy_in("FSDP::reduce_scatter_copy_in", label);
    for (size_t i = 0; i < params.size(); ++i) {
      const ShardLayout& pl = params[i]->layout();
      // [world, shard_rows, row_numel]: rank r's padded shard of this param.
      at::Tensor block = result.input.narrow(1, layout.offsets[i], layout.numels[i])
                             .view({result.world, pl.shard_rows, pl.row_numel});
      const at::Tensor& grad = unsharded_grads[i];
      if (!grad.defined()) {
        block.zero_();
        continue;
      }
      result.has_grad[i] = true;
      const at::Tensor rows = to_moved_layout(grad, pl).reshape({pl.dim0, pl.row_numel});
      if (pl.padded_rows() == pl.dim0) {
        block.copy_(rows.reshape({result.world, pl.shard_rows, pl.row_numel}));
        continue;
      }
      block.zero_();  // Note [Dim-0 padding]: padding rows reduce as zeros
      for (int r = 0; r < result.world; ++r) {
        const int64_t first = r * pl.shard_rows;
        const int64_t count = std::min<int64_t>(pl.shard_rows, pl.dim0 - first);
        if (count <= 0) break;
        block.select(0, r).narrow(0, 0, count).copy_(rows.narrow(0, first, count));
      }
    }
  }
  const at::Tensor flat_input = result.input.view({-1});
  // Note [FSDP streams]: copied in on the compute stream, issued on the reduce-scatter's. The
  // output is that stream's: it is divided and read there, and freed back to its pool.
  if (streams != nullptr) streams->wait(StreamRole::kReduceScatter, StreamRole::kCompute);
  StreamScope on_reduce_scatter(streams, StreamRole::kReduceScatter);
  result.output = custom != nullptr
                      ? allocate_checked(*custom, layout.total, options, "reduce-scatter", label)
                      : at::empty({layout.total}, options);
  if (hook) {
    result.work = run_reduce_hook(hook, result.output, flat_input, label, stats);
  } else if (custom != nullptr) {
    CommTimer issue(stats.comm_issue_ns);
    CollectiveLabelScope label_scope(label + " reduce_scatter");
    result.work = completed_if_null(
        (*custom)(result.output, flat_input, group, ReduceOp::SUM, /*async_op=*/true),
        "reduce_scatter_tensor", result.output);
  } else if (group->size() == 1) {
    // No collective marks the input in use by this stream (as the process group's does): it
    // was allocated on the compute stream, which may reuse it once the host drops it.
    if (streams != nullptr) streams->record_use(result.input, StreamRole::kReduceScatter);
    result.output.copy_(flat_input);
    CommTimer issue(stats.comm_issue_ns);
    result.work = completed_work("reduce_scatter_tensor", {result.output});
  } else {
    CommTimer issue(stats.comm_issue_ns);
    CollectiveLabelScope label_scope(label + " reduce_scatter");
    result.work = reduce_scatter_tensor(result.output, flat_input, ReduceOp::SUM, group,
                                        /*async_op=*/true);
  }
  return result;
}

at::Tensor all_gather_whole(const at::Tensor& local, const ShardedParam& param,
                            const ProcessGroupPtr& group) {
  const ShardLayout& pl = param.layout();
  const at::TensorOptions options = local.options().device(param.unsharded_options().device());
  if (pl.numel() == 0) return at::empty(pl.shape, options);  // same layout on every rank
  at::Tensor padded = at::zeros({pl.shard_rows, pl.row_numel}, options);
  if (pl.local_rows > 0) {
    padded.narrow(0, 0, pl.local_rows)
        .copy_(to_moved_layout(local.detach(), pl).reshape({pl.local_rows, pl.row_numel}));
  }
  at::Tensor full = at::empty({pl.padded_rows(), pl.row_numel}, options);
  if (group->size() == 1) {
    full.copy_(padded);
  } else {
    WorkPtr work = all_gather_into_tensor(full, padded, group, /*async_op=*/true);
    work->wait(group->timeout().count() > 0 ? group->timeout() : kDefaultPgTimeout);
  }
  if (pl.shard_dim == 0) return full.narrow(0, 0, pl.dim0).view(pl.shape);
  return to_param_layout(full.narrow(0, 0, pl.dim0).view(pl.moved_shape()), pl).contiguous();
}

at::Tensor reduced_shard_grad(const ReduceScatterResult& result, const ShardedParam& param,
                              int64_t offset) {
  const ShardLayout& pl = param.layout();
  return to_param_layout(result.output.narrow(0, offset, pl.padded_shard_numel())
                             .view(pl.padded_shard_shape())
                             .narrow(0, 0, pl.local_rows),
                         pl);
}

WorkPtr run_reduce_hook(const ReduceHook& hook, const at::Tensor& output, const at::Tensor& input,
                        const std::string& label, FSDPStats& stats) {
  TraceScope trace("FSDP::reduce_hook", label);
  {
    CommTimer issue(stats.comm_issue_ns);  // the hook's collectives, issued and waited
    hook(input, output);
  }
  return completed_work("reduce_scatter_tensor", {output});
}

}  // namespace tdist::fsdp::detail

#include "fsdp/per_call_buffers.h"

#include "fsdp/device_streams.h"
#include "fsdp/hook_timing.h"
#include "fsdp/sharded_param.h"
#include "fsdp/trace_scope.h"

namespace tdist::fsdp::detail {

void PerCallBuffers::start_all_gather(const at::Tensor& slab, const ProcessGroupPtr& slab_group,
                                      bool inputs_ordered) {
  const FlatLayout& layout = *context_.layout;
  if (slab.defined()) {
    // Note [Reshard to a smaller group]: the slab holds world/k rank blocks; gathering the
    // k slabs of the small group rebuilds the whole [world, total] buffer. The compute
    // stream wrote it (post_forward): the copy-in waits for it.
    all_gather_ =
        foreach_all_gather(context_.params, layout, slab_group, context_.labels.module,
                           context_.stats, context_.streams,
                           /*wait_for_compute=*/true, slab, context_.custom_comms.all_gather.get());
  } else {
    all_gather_ = foreach_all_gather(context_.params, layout, context_.group,
                                     context_.labels.module, context_.stats, context_.streams,
                                     /*wait_for_compute=*/!inputs_ordered, /*input=*/{},
                                     context_.custom_comms.all_gather.get());
  }
}

void PerCallBuffers::finish_all_gather() {
  TraceScope trace("FSDP::all_gather_copy_out", context_.labels.module);
  CopyTimer copy(context_.stats);
  DeviceStreams* streams = context_.streams;
  // Note [FSDP streams]: the gathered data was last written on (or ordered before) the copy-in
  // stream: the collective itself, a group of one's copy, a host backend's copy back.
  if (streams != nullptr) streams->wait(StreamRole::kCompute, StreamRole::kAllGatherCopyIn);
  for (ShardedParam* p : context_.params) p->alloc_unsharded();
  foreach_all_gather_copy_out(all_gather_, context_.params, *context_.layout);
  // The buffers go back to the copy-in stream's pool: its next allocation waits for the
  // copy-out that reads them.
  if (streams != nullptr) streams->wait(StreamRole::kAllGatherCopyIn, StreamRole::kCompute);
  all_gather_ = AllGatherResult();  // frees the collective's buffers
}

void PerCallBuffers::free_unsharded() {
  for (ShardedParam* p : context_.params) p->free_unsharded();
}

size_t PerCallBuffers::unsharded_bytes() const {
  size_t total = 0;
  for (ShardedParam* p : context_.params) total += p->unsharded_nbytes();
  return total;
}

void PerCallBuffers::start_reduce_scatter(const std::vector<at::Tensor>& grads,
                                          c10::ScalarType reduce_dtype) {
  reduce_ = foreach_reduce(context_.params, grads, *context_.layout, context_.group,
                           context_.labels.module, reduce_dtype, context_.stats, context_.streams,
                           context_.reduce_hook, context_.custom_comms.reduce_scatter.get());
}

void PerCallBuffers::install_reduced_grads(double divisor) {
  CopyTimer copy(context_.stats);
  if (divisor != 1.0) reduce_.output.div_(divisor);  // a group of one: nothing to average
  const std::vector<ShardedParam*>& params = context_.params;
  bool host_copy_in_flight = false;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i]->requires_grad()) {
      params[i]->accumulate_sharded_grad(at::Tensor());
      continue;
    }
    // accumulate_sharded_grad copies (a view of the output buffer would not do: optimizers
    // detach_() grads in zero_grad, which autograd refuses on views; the buffer is freed right
    // after). Copies to pinned host shards do not block the host (Note [FSDP streams]).
    host_copy_in_flight |= params[i]->accumulate_sharded_grad(
        reduced_shard_grad(reduce_, *params[i], context_.layout->offsets[i]),
        /*non_blocking=*/context_.streams != nullptr);
  }
  if (host_copy_in_flight) context_.streams->mark_host_fence();
  reduce_ = ReduceScatterResult();
}

}  // namespace tdist::fsdp::detail

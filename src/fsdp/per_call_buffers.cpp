#include "fsdp/per_call_buffers.h"

#include "fsdp/hook_timing.h"
#include "fsdp/sharded_param.h"
#include "fsdp/trace_scope.h"

namespace tdist::fsdp::detail {

void PerCallBuffers::start_all_gather(const at::Tensor& slab, const ProcessGroupPtr& slab_group) {
  const FlatLayout& layout = *context_.layout;
  if (slab.defined()) {
    // Note [Reshard to a smaller group]: the slab holds world/k rank blocks; gathering the
    // k slabs of the small group rebuilds the whole [world, total] buffer.
    all_gather_ = foreach_all_gather(context_.params, layout, slab_group, context_.labels.module,
                                     context_.stats, slab);
  } else {
    all_gather_ = foreach_all_gather(context_.params, layout, context_.group,
                                     context_.labels.module, context_.stats);
  }
}

void PerCallBuffers::finish_all_gather() {
  TraceScope trace("FSDP::all_gather_copy_out", context_.labels.module);
  CopyTimer copy(context_.stats);
  for (ShardedParam* p : context_.params) p->alloc_unsharded();
  foreach_all_gather_copy_out(all_gather_, context_.params, *context_.layout);
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
                           context_.labels.module, reduce_dtype, context_.stats);
}

void PerCallBuffers::install_reduced_grads(double divisor) {
  CopyTimer copy(context_.stats);
  reduce_.output.div_(divisor);
  const std::vector<ShardedParam*>& params = context_.params;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i]->requires_grad()) {
      params[i]->accumulate_sharded_grad(at::Tensor());
      continue;
    }
    // A copy, not a view of the output buffer: optimizers detach_() grads in zero_grad,
    // which autograd refuses on views; the buffer is freed right after.
    params[i]->accumulate_sharded_grad(
        reduced_shard_grad(reduce_, *params[i], context_.layout->offsets[i]).clone());
  }
  reduce_ = ReduceScatterResult();
}

}  // namespace tdist::fsdp::detail

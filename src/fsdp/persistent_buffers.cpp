#include "fsdp/persistent_buffers.h"

#include <chrono>
#include <iostream>

#include <ATen/ATen.h>

#include "fsdp/flat_collectives.h"
#include "fsdp/hook_timing.h"
#include "fsdp/sharded_param.h"
#include "fsdp/trace_scope.h"
#include "tdist/detail/util/torch_compat.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {

namespace {

// A plain contiguous tensor of `sizes` over `base`'s storage, `offset` elements in
// (util::alias_storage: optimizers may detach_() it).
at::Tensor raw_alias(const at::Tensor& base, int64_t offset, const std::vector<int64_t>& sizes) {
  return util::contiguous_alias(base, sizes, base.storage_offset() + offset);
}

}  // namespace

PersistentBuffers::PersistentBuffers(const GroupBuffersContext& context, at::Tensor flat_shard,
                                     bool symmetric, bool placed_all_gather)
    : context_(context),
      flat_(*context.layout),
      symmetric_(symmetric),
      element_size_(context.params.front()->shard_options().dtype().itemsize()),
      flat_shard_(std::move(flat_shard)) {
  const std::vector<ShardedParam*>& params = context_.params;
  if (flat_shard_.numel() != flat_.total) {
    TDIST_THROW(Error, "FSDP internal: module '" + context_.labels.module + "': flat shard of " +
                           std::to_string(flat_shard_.numel()) + " elements for " +
                           std::to_string(flat_.total) + " padded shard elements");
  }
  const at::TensorOptions& options = params.front()->shard_options();
  // Note [One unsharded storage per group]: every param's unsharded tensor is an alias of one
  // StorageImpl, so unshard and reshard each touch one storage, not one per param (cold in
  // cache right after the module's compute).
  unsharded_flat_ = util::unallocated({world() * flat_.total}, params.front()->unsharded_options());
  for (size_t i = 0; i < params.size(); ++i) {
    params[i]->share_unsharded_storage(unsharded_flat_, world() * flat_.offsets[i]);
  }
  // Note [Pooled blocks in symmetric memory] (buffer_pool.cpp).
  all_gather_out_.init(world() * flat_.total, options, symmetric_);
  reduce_in_.init(world() * flat_.total, options, symmetric_);
  reduce_tmp_.init(flat_.total, options, symmetric_);
  for (size_t i = 0; i < params.size(); ++i) {
    tmp_slices_.push_back(
        raw_alias(reduce_tmp_.tensor(), flat_.offsets[i], params[i]->layout().local_shape()));
  }
  // Note [Placed all-gather]: where the backend can, the all-gather writes every rank's
  // block straight into the unsharded block (no rank-major buffer, no copy-out).
  placed_all_gather_ = placed_all_gather && can_all_gather_placed(flat_shard_, context_.group);
}

// Note [Abandoned placed all-gather]
// The unsharded block is held while an all-gather is pending only when that all-gather is
// placed (training abandoned mid-step, e.g. an exception out of a module's forward while the
// next module's all-gather was prefetched): it writes into the block from the collective's
// thread, so give it a moment, and if it has not finished, leak the block rather than free
// memory that thread may still write. The placer shares the layout it reads, so nothing else
// of this group is touched after it is gone.
PersistentBuffers::~PersistentBuffers() {
  if (unsharded_block_ && all_gather_work_) {
    try {
      all_gather_work_->wait(std::chrono::seconds(5));
    } catch (...) {
      // Failed collectives write nothing more; a timeout is checked below.
    }
    if (!all_gather_work_->is_completed()) {
      std::cerr << "tdist FSDP warning: module '" << context_.labels.module
                << "' was destroyed while its all-gather was still in flight (a step abandoned "
                   "midway, with a peer not yet there); leaking its "
                << unsharded_block_.capacity
                << "-byte unsharded block, which that collective may still write\n";
      new PooledBlock(std::move(unsharded_block_));
    }
  }
  // Views autograd saved may outlive the group: they must see 0 bytes, not freed memory.
  if (unsharded_block_) util::free_storage(unsharded_flat_);
}

int PersistentBuffers::world() const {
  return context_.params.front()->layout().world;
}

size_t PersistentBuffers::unsharded_block_bytes() const {
  return static_cast<size_t>(world() * flat_.total) * element_size_;
}

void PersistentBuffers::start_all_gather(const at::Tensor& slab, const ProcessGroupPtr& slab_group,
                                         bool /*inputs_ordered: CPU groups have no streams*/) {
  TraceScope trace("FSDP::all_gather", context_.labels.module);
  FSDPStats& stats = context_.stats;
  all_gather_input_ = slab.defined() ? slab : flat_shard_;
  if (!slab.defined() && placed_all_gather_) {
    {
      CopyTimer copy(stats);
      unsharded_block_ =
          buffer_pool().acquire(unsharded_block_bytes(), flat_shard_.device(), symmetric_);
    }
    all_gather_work_ =
        issue_all_gather_placed(static_cast<char*>(unsharded_block_.data.get()), all_gather_input_,
                                context_.layout, context_.group, context_.labels.all_gather, stats);
    return;
  }
  {
    CopyTimer copy(stats);
    all_gather_out_.acquire();
  }
  all_gather_work_ = issue_all_gather(all_gather_out_.tensor(), all_gather_input_,
                                      slab.defined() ? slab_group : context_.group,
                                      context_.labels.all_gather, stats);
}

void PersistentBuffers::finish_all_gather() {
  TraceScope trace("FSDP::all_gather_copy_out", context_.labels.module);
  CopyTimer copy(context_.stats);
  const size_t nbytes = unsharded_block_bytes();
  if (all_gather_out_.held()) {  // gathered rank-major: copy out (else placed already)
    unsharded_block_ = buffer_pool().acquire(nbytes, flat_shard_.device(), symmetric_);
    copy_out_flat(all_gather_out_.data(), static_cast<char*>(unsharded_block_.data.get()), flat_,
                  world(), element_size_);
    all_gather_out_.release();
  }
  util::borrow_storage(unsharded_flat_, static_cast<char*>(unsharded_block_.data.get()), nbytes);
  all_gather_work_.reset();
  all_gather_input_ = at::Tensor();
}

// Note [Freeing unsharded storage] and Note [Buffer pool].
void PersistentBuffers::free_unsharded() {
  util::free_storage(unsharded_flat_);
  buffer_pool().release(std::move(unsharded_block_));
  unsharded_block_ = PooledBlock();
}

size_t PersistentBuffers::unsharded_bytes() const {
  return util::storage_nbytes(unsharded_flat_);
}

void PersistentBuffers::init_grad_buffer() {
  const std::vector<ShardedParam*>& params = context_.params;
  grad_flat_ = at::zeros({flat_.total}, params.front()->shard_options());
  for (size_t i = 0; i < params.size(); ++i) {
    params[i]->set_grad_alias(
        raw_alias(grad_flat_, flat_.offsets[i], params[i]->layout().local_shape()));
  }
}

// Note [Persistent gradient buffer]
// The sharded gradients are plain tensors over the group's persistent grad_flat_
// (ShardedParam::grad_alias), like DDP's gradient_as_bucket_view: a gradient a caller keeps
// across steps is overwritten by the next reduce. When no stashed gradient lives in
// grad_flat_ (first step, or grads set to None) the reduce-scatter writes straight into it;
// otherwise (gradient accumulation, or zero_grad() zeroing in place as LibTorch 1.13 does) it
// writes into a pooled temporary that is then added onto the stash in place.
void PersistentBuffers::choose_reduce_target() {
  reduce_direct_ = true;
  reduce_flat_add_ = grad_flat_.defined();
  if (!grad_flat_.defined()) return;
  const c10::StorageImpl* buffer = grad_flat_.storage().unsafeGetStorageImpl();
  for (ShardedParam* p : context_.params) {
    const bool aliases = p->stash_aliases(buffer);
    reduce_direct_ = reduce_direct_ && !aliases;
    if (p->requires_grad()) reduce_flat_add_ = reduce_flat_add_ && aliases;
  }
}

void PersistentBuffers::start_reduce_scatter(const std::vector<at::Tensor>& grads,
                                             c10::ScalarType /*reduce_dtype: the shard dtype*/) {
  TraceScope trace("FSDP::reduce_scatter", context_.labels.module);
  choose_reduce_target();
  {
    TraceScope copy_in("FSDP::reduce_scatter_copy_in", context_.labels.module);
    CopyTimer copy(context_.stats);
    if (!grad_flat_.defined()) init_grad_buffer();
    reduce_in_.acquire();
    copy_in_grads(reduce_in_.tensor(), context_.params, grads, flat_);
    if (!reduce_direct_) reduce_tmp_.acquire();
    reduce_output_ = reduce_direct_ ? grad_flat_ : reduce_tmp_.tensor();
  }
  reduce_work_ =
      issue_reduce_scatter(reduce_output_, reduce_in_.tensor(), context_.group,
                           context_.labels.reduce_scatter, context_.stats, context_.reduce_hook);
}

void PersistentBuffers::install_reduced_grads(double divisor) {
  CopyTimer copy(context_.stats);
  const std::vector<ShardedParam*>& params = context_.params;
  reduce_in_.release();
  if (divisor != 1.0) reduce_output_.div_(divisor);
  if (reduce_direct_) {
    for (ShardedParam* p : params) {
      if (p->requires_grad()) {
        p->install_reduced_grad(nullptr);
      } else {
        p->accumulate_sharded_grad(at::Tensor());
      }
    }
  } else if (reduce_flat_add_) {
    // Every trainable stash is its own rows of grad_flat_: one add over the buffer (padding
    // and frozen rows add zeros), then each stash goes back as the gradient.
    grad_flat_.add_(reduce_tmp_.tensor());
    for (ShardedParam* p : params) p->accumulate_sharded_grad(at::Tensor());
    reduce_tmp_.release();
  } else {
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i]->requires_grad()) {
        params[i]->install_reduced_grad(&tmp_slices_[i]);
      } else {
        params[i]->accumulate_sharded_grad(at::Tensor());
      }
    }
    reduce_tmp_.release();
  }
  reduce_output_ = at::Tensor();
  reduce_work_.reset();
}

void PersistentBuffers::drop_reduced() {
  reduce_in_.release();
  if (!reduce_direct_) reduce_tmp_.release();
  reduce_output_ = at::Tensor();
  reduce_work_.reset();
}

}  // namespace tdist::fsdp::detail

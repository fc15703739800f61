#include "fsdp/sharded_param.h"

#include <ATen/ATen.h>

#include "tdist/detail/util/torch_compat.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {

at::Tensor to_param_layout(const at::Tensor& moved, const ShardLayout& layout) {
  return layout.shard_dim == 0 ? moved : moved.movedim(0, layout.shard_dim);
}

at::Tensor to_moved_layout(const at::Tensor& shown, const ShardLayout& layout) {
  return layout.shard_dim == 0 ? shown : shown.movedim(layout.shard_dim, 0);
}

ShardedParam::ShardedParam(std::string fqn, at::Tensor param, int world, int rank,
                           const ParamPolicy& policy, const at::Tensor& shard_buffer,
                           int64_t shard_dim)
    : fqn_(std::move(fqn)), param_(std::move(param)) {
  TDIST_CHECK_ARG(param_.defined(), "fully_shard: parameter '" + fqn_ + "' is undefined");
  init(world, rank, shard_dim, policy, shard_buffer, param_.device(), nullptr);
}

ShardedParam::ShardedParam(std::string fqn, at::Tensor param, int world, int rank,
                           const ParamPolicy& policy, const at::Tensor& shard_buffer,
                           const c10::Device& device, const RowsFill& fill, int64_t shard_dim)
    : fqn_(std::move(fqn)), param_(std::move(param)) {
  TDIST_CHECK_ARG(param_.defined() && param_.is_meta() && fill,
                  "FSDP internal: filling the shard of '" + fqn_ + "', which is not a meta tensor");
  init(world, rank, shard_dim, policy, shard_buffer, device, fill);
}

void ShardedParam::init(int world, int rank, int64_t shard_dim, const ParamPolicy& policy,
                        const at::Tensor& shard_buffer, const c10::Device& device,
                        const RowsFill& fill) {
  layout_ = ShardLayout::compute(param_.sizes().vec(), world, rank, shard_dim);
  requires_grad_ = param_.requires_grad();
  const c10::Device compute = policy.compute_device.value_or(device);
  unsharded_options_ =
      param_.options().dtype(policy.param_dtype.value_or(param_.scalar_type())).device(compute);
  shard_options_ = param_.options().device(device);
  if (policy.offload_to_cpu) {
    shard_options_ = shard_options_.device(c10::kCPU);
    // Page-locked memory needs a CUDA runtime; on a CPU-only run it would only cost.
    if (policy.pin_memory && compute.is_cuda()) shard_options_ = shard_options_.pinned_memory(true);
  }
  at::NoGradGuard no_grad;
  padded_shard_ = shard_buffer.defined() ? shard_buffer.view(layout_.padded_shard_shape())
                                         : at::zeros(layout_.padded_shard_shape(), shard_options_);
  if (layout_.local_rows > 0) {
    const at::Tensor rows = padded_shard_.view({layout_.shard_rows, layout_.row_numel})
                                .narrow(0, 0, layout_.local_rows);
    if (fill && layout_.shard_dim == 0) {
      fill(rows.view(layout_.local_shape()), layout_.row_offset);
    } else if (fill) {
      // The loader writes rows of dim 0; a shard along another dim takes slices of the whole
      // parameter, made once here (one parameter's full size, transiently).
      at::Tensor full = at::zeros(layout_.shape, shard_options_);
      fill(full, 0);
      copy_local_rows(rows, full);
    } else {
      copy_local_rows(rows, param_.detach());
    }
  }
  local_shard_ = to_param_layout(padded_shard_.narrow(0, 0, layout_.local_rows), layout_);
  // Note [Freeing unsharded storage]: shaped now, memory only while unsharded.
  padded_unsharded_ = util::unallocated(layout_.padded_unsharded_shape(), unsharded_options_);
  unsharded_view_ = unsharded_alias(padded_unsharded_, 0);
  if (param_.is_meta()) {
    // Tensor::set_data refuses a meta -> dense change; the TensorImpl's own shallow copy
    // makes it (as deferred init's allocation does), keeping the autograd metadata.
    param_.unsafeGetTensorImpl()->shallow_copy_from(local_shard_.getIntrusivePtr());
  } else {
    util::set_data_in_place(param_, local_shard_);
  }
  holds_unsharded_ = false;
}

void ShardedParam::copy_local_rows(const at::Tensor& rows, const at::Tensor& full) const {
  const at::Tensor moved =
      to_moved_layout(full, layout_).reshape({layout_.dim0, layout_.row_numel});
  rows.copy_(moved.narrow(0, layout_.row_offset, layout_.local_rows));
}

at::Tensor ShardedParam::unsharded_alias(const at::Tensor& storage, int64_t offset) const {
  const int64_t d = layout_.shard_dim;
  if (d == 0) return util::contiguous_alias(storage, layout_.shape, offset);
  // The moved layout is contiguous; the parameter sees it with dim 0 moved to d. Built by
  // hand, not by movedim: the storage may hold no bytes yet (movedim checks the bounds).
  const std::vector<int64_t> moved = layout_.moved_shape();
  std::vector<int64_t> moved_strides(moved.size(), 1);
  for (size_t i = moved.size(); i-- > 1;) moved_strides[i - 1] = moved_strides[i] * moved[i];
  std::vector<int64_t> sizes, strides;
  for (int64_t j = 0; j < static_cast<int64_t>(moved.size()); ++j) {
    const int64_t source = j < d ? j + 1 : (j == d ? 0 : j);
    sizes.push_back(moved[source]);
    strides.push_back(moved_strides[source]);
  }
  return util::alias_storage(storage, sizes, strides, offset);
}

void ShardedParam::alloc_unsharded() {
  const size_t nbytes =
      static_cast<size_t>(padded_unsharded_.numel()) * padded_unsharded_.element_size();
  util::allocate_storage(padded_unsharded_, nbytes);
}

void ShardedParam::free_unsharded() {
  if (holds_unsharded_) {
    TDIST_THROW(Error, "FSDP internal: freeing the unsharded storage of '" + fqn_ +
                           "' while the parameter still holds it");
  }
  util::free_storage(padded_unsharded_);
}

size_t ShardedParam::unsharded_nbytes() const {
  return util::storage_nbytes(padded_unsharded_);
}

void ShardedParam::use_unsharded() {
  if (holds_unsharded_) return;
  util::point_at(param_, unsharded_view_);
  holds_unsharded_ = true;
}

void ShardedParam::use_full(const at::Tensor& full) {
  util::set_data_in_place(param_, full);
  holds_unsharded_ = true;
}

void ShardedParam::use_sharded() {
  if (!holds_unsharded_) return;
  util::point_at(param_, local_shard_);
  holds_unsharded_ = false;
}

void ShardedParam::stash_sharded_grad() {
  at::Tensor& grad = param_.mutable_grad();
  if (!grad.defined()) return;
  if (grad.sizes() != local_shard_.sizes()) {
    // An unsharded gradient left over means a backward did not finish through FSDP.
    TDIST_THROW(Error, "FSDP: parameter '" + fqn_ +
                           "' has a gradient of unsharded shape before backward; a previous "
                           "backward bypassed FSDP. Call modules through tdist::fsdp::forward");
  }
  if (stashed_grad_.defined()) {
    stashed_grad_.add_(grad);
  } else {
    stashed_grad_ = grad;
  }
  grad = at::Tensor();
}

at::Tensor ShardedParam::take_unsharded_grad() {
  at::Tensor& grad = param_.mutable_grad();
  at::Tensor out = grad;
  grad = at::Tensor();
  return out;
}

void ShardedParam::accumulate_unsharded_grad(const at::Tensor& grad) {
  if (!grad.defined()) return;
  if (accumulated_unsharded_grad_.defined()) {
    accumulated_unsharded_grad_.add_(grad);
  } else {
    accumulated_unsharded_grad_ = grad;
  }
}

at::Tensor ShardedParam::take_accumulated_unsharded_grad() {
  at::Tensor out = std::move(accumulated_unsharded_grad_);
  accumulated_unsharded_grad_ = at::Tensor();
  return out;
}

bool ShardedParam::accumulate_sharded_grad(const at::Tensor& reduced, bool non_blocking) {
  at::Tensor& slot = param_.mutable_grad();
  at::Tensor total = std::move(stashed_grad_);
  stashed_grad_ = at::Tensor();
  // The host adds to what it copies only once the copy has landed. Only into pinned shards
  // (CPUOffloadPolicy(pin_memory)): a non-blocking copy to the host allocates pinned memory
  // itself, which pin_memory(false) asks not to use (FSDP2 copies blocking then).
  const bool in_flight = non_blocking && reduced.defined() && !total.defined() && !slot.defined() &&
                         shard_options_.device().is_cpu() && shard_options_.pinned_memory() &&
                         !reduced.is_cpu();
  // Note [Mixed precision and offload]: the sharded gradient has the shard's dtype/device.
  const at::Tensor grad =
      reduced.defined() ? reduced.to(shard_options_, in_flight, /*copy=*/true) : reduced;
  if (grad.defined()) {
    if (total.defined()) {
      total.add_(grad);
    } else {
      total = grad;
    }
  }
  if (slot.defined() && total.defined()) {
    // A gradient that appeared outside backward (user code) is kept, not overwritten.
    slot = slot + total;
  } else if (total.defined()) {
    slot = total;
  }
  return in_flight;
}

void ShardedParam::share_unsharded_storage(const at::Tensor& group_unsharded, int64_t offset) {
  const int64_t at = group_unsharded.storage_offset() + offset;
  padded_unsharded_ = util::contiguous_alias(group_unsharded, layout_.padded_unsharded_shape(), at);
  unsharded_view_ = unsharded_alias(group_unsharded, at);
}

void ShardedParam::own_unsharded_storage() {
  if (holds_unsharded_) {
    TDIST_THROW(Error, "FSDP internal: re-homing the unsharded storage of '" + fqn_ +
                           "' while the parameter holds it");
  }
  padded_unsharded_ = util::unallocated(layout_.padded_unsharded_shape(), unsharded_options_);
  unsharded_view_ = unsharded_alias(padded_unsharded_, 0);
  grad_alias_ = at::Tensor();
}

void ShardedParam::set_grad_alias(at::Tensor alias) {
  grad_alias_ = std::move(alias);
}

bool ShardedParam::stash_aliases(const c10::StorageImpl* storage) const {
  return stashed_grad_.defined() && stashed_grad_.has_storage() &&
         stashed_grad_.storage().unsafeGetStorageImpl() == storage;
}

void ShardedParam::install_reduced_grad(const at::Tensor* reduced) {
  at::Tensor& slot = param_.mutable_grad();
  at::Tensor total = std::move(stashed_grad_);
  stashed_grad_ = at::Tensor();
  if (reduced == nullptr) {
    // The reduce-scatter wrote this step's gradient straight into grad_alias_'s rows.
    if (total.defined()) {
      total.add_(grad_alias_);
    } else {
      total = grad_alias_;
    }
  } else if (total.defined()) {
    total.add_(*reduced);  // accumulates in place (in the buffer when total is the alias)
  } else {
    grad_alias_.copy_(*reduced);
    total = grad_alias_;
  }
  if (slot.defined()) {
    slot = slot + total;  // a gradient that appeared outside backward is kept
  } else {
    slot = total;
  }
}

}  // namespace tdist::fsdp::detail

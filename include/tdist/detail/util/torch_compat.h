#pragma once

// Version-specific LibTorch calls, kept in one place. tdist builds against LibTorch 2.9 and
// newer (the floor cmake/TdistDependencies.cmake enforces; tested on the release pinned in
// tools/torch-version.txt). Every call here exists unchanged from 2.9 to that release; a
// call that differs between releases gets a branch on TORCH_VERSION_MAJOR/MINOR here, with
// the releases each branch serves.

#include <cstddef>
#include <vector>

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>

namespace tdist::util {

/// The key of `param` in torch::optim::Optimizer::state(): its TensorImpl's address (2.0+;
/// 1.13 keyed by that address printed as a string).
inline void* optimizer_state_key(const at::Tensor& param) {
  return param.unsafeGetTensorImpl();
}

/// The state of `device`'s default generator (the CPU's, or an accelerator's: a CPU byte
/// tensor either way), read under the generator's lock; through the device-generic
/// at::Context::defaultGenerator, so this code needs no CUDA headers.
at::Tensor generator_state(const c10::Device& device);
/// Sets `device`'s default generator to `state` (what generator_state returned).
void set_generator_state(const c10::Device& device, const at::Tensor& state);

/// Turns autocast for `device` (kCPU, kCUDA) on (to `dtype`) or off, returning whether it
/// was on; the device-type API of 2.4+ (before it: set_cpu_enabled / set_autocast_cpu_dtype).
inline bool set_autocast(at::DeviceType device, bool enabled, at::ScalarType dtype) {
  const bool previous = at::autocast::is_autocast_enabled(device);
  at::autocast::set_autocast_enabled(device, enabled);
  if (enabled) at::autocast::set_autocast_dtype(device, dtype);
  return previous;
}

/// Frees the bytes of `tensor`'s storage in place (the StorageImpl stays, now 0 bytes), as
/// Python's `tensor.untyped_storage().resize_(0)`. Every tensor and view sharing that storage
/// (e.g. views saved by autograd) sees the change. CPU and CUDA.
void free_storage(const at::Tensor& tensor);

/// Gives `tensor`'s storage `nbytes` fresh (uninitialised) bytes from its own allocator, in
/// place; the inverse of free_storage. A no-op when it already holds nbytes.
void allocate_storage(const at::Tensor& tensor, size_t nbytes);

/// Bytes the storage behind `tensor` currently holds (0 after free_storage).
size_t storage_nbytes(const at::Tensor& tensor);

/// Replaces the data of `variable` in place, keeping its identity (TensorImpl), autograd
/// metadata and version counter: `variable.data = data` in Python.
void set_data_in_place(const at::Tensor& variable, const at::Tensor& data);

}  // namespace tdist::util

// ---- raw TensorImpl / StorageImpl access (FSDP's hot path) ------------------------------
// Each of these replaces a dispatcher call with the same field writes; every TensorImpl and
// StorageImpl member used exists unchanged from 2.9 to the pinned release.

#include <ATen/ops/empty.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

namespace tdist::util {

/// Points `variable` at `data`'s storage, sizes, strides and offset, keeping its identity,
/// autograd metadata and version counter (as set_data_in_place). When dtype, device, layout
/// and dispatch keys already agree this writes those TensorImpl fields directly, skipping
/// set_data's dispatcher round trip, checks and full metadata copy; otherwise it falls back
/// to set_data_in_place.
inline void point_at(const at::Tensor& variable, const at::Tensor& data) {
  c10::TensorImpl* impl = variable.unsafeGetTensorImpl();
  const c10::TensorImpl* src = data.unsafeGetTensorImpl();
  if (impl->dtype() == src->dtype() && impl->device() == src->device() &&
      impl->layout() == src->layout() && impl->key_set() == src->key_set() &&
      impl->allow_tensor_metadata_change() && impl->has_storage() && src->has_storage()) {
    impl->set_storage_keep_dtype(src->storage());
    impl->set_sizes_and_strides(src->sizes(), src->strides());
    impl->set_storage_offset(src->storage_offset());
    return;
  }
  set_data_in_place(variable, data);
}

/// A new plain TensorImpl over `base`'s storage with `sizes`, `strides` and `storage_offset`:
/// not an autograd view (no view metadata, so an optimizer may detach_() it), and built
/// directly: set_() would also allocate the storage up to the alias's extent when it holds
/// fewer bytes (a pooled buffer between steps), and view ops cost a dispatcher round trip.
inline at::Tensor alias_storage(const at::Tensor& base, c10::IntArrayRef sizes,
                                c10::IntArrayRef strides, int64_t storage_offset) {
  const c10::TensorImpl* impl = base.unsafeGetTensorImpl();
  at::Tensor alias = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(base.storage()),
                                                              impl->key_set(), impl->dtype());
  c10::TensorImpl* out = alias.unsafeGetTensorImpl();
  out->set_sizes_and_strides(sizes, strides);
  out->set_storage_offset(storage_offset);
  return alias;
}

/// alias_storage with contiguous strides for `sizes`.
inline at::Tensor contiguous_alias(const at::Tensor& base, c10::IntArrayRef sizes,
                                   int64_t storage_offset) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
  return alias_storage(base, sizes, strides, storage_offset);
}

/// A contiguous tensor of `sizes` whose storage holds 0 bytes (as after free_storage): its
/// shape is there before its memory, which allocate_storage, borrow_storage or give_storage
/// attach later. Nothing is allocated, not even address space.
inline at::Tensor unallocated(c10::IntArrayRef sizes, const at::TensorOptions& options) {
  return contiguous_alias(at::empty({0}, options), sizes, 0);
}

/// Makes `tensor`'s storage use `nbytes` of memory it does not own, starting at `data`
/// (e.g. a slice of a larger buffer whose owner outlives this use); free_storage detaches it
/// again without freeing anything.
inline void borrow_storage(const at::Tensor& tensor, void* data, size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(data, tensor.device()));
  storage->set_nbytes(nbytes);
}

/// Takes the allocation out of `tensor`'s storage (which then holds 0 bytes), handing its
/// ownership to the caller; the inverse of give_storage.
inline at::DataPtr take_storage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  at::DataPtr out = storage->set_data_ptr(at::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(static_cast<size_t>(0));
  return out;
}

/// Gives `tensor`'s storage the allocation `data` (nbytes usable bytes), in place.
inline void give_storage(const at::Tensor& tensor, at::DataPtr&& data, size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(std::move(data));
  storage->set_nbytes(nbytes);
}

}  // namespace tdist::util

#pragma once

// Version-specific LibTorch calls, kept in one place. tdist builds against LibTorch 1.13 and
// 2.x; every call here exists in both, or is switched on TORCH_VERSION_MAJOR.

#include <cstddef>

#include <ATen/core/Tensor.h>

namespace tdist::util {

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

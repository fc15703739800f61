#pragma once

// Symmetric memory: CPU tensors whose storage is a POSIX shared-memory object that the other
// ranks on this host can map (the CPU counterpart of torch.distributed._symmetric_memory).
//
// A collective whose tensors live in symmetric memory on every rank skips the copy through the
// backend's staging segments: peers read each other's tensors directly. With the Gloo engine
// an all_reduce then moves ~2.5 buffer sizes through memory per rank at world 2 instead of ~4,
// which is what bounds a large all_reduce on one host. The Gloo engine and the MPI backend
// have this path for all_reduce, all_gather_into_tensor (the input or the output; peers read
// the input when it is symmetric) and reduce_scatter_tensor (the input). DDP allocates its
// gradient buckets here when the group allows it, FSDP its flat shards and pooled buffers.
//
// Rules:
//  - Pass symmetric tensors on every rank of a collective or on none: a mix raises
//    DistBackendError on every rank (the ranks cannot agree on a path otherwise).
//  - Any contiguous view works (offsets may differ between ranks).
//  - Groups that span hosts, or that run with TDIST_GLOO_SHM=0 (Gloo) or TDIST_MPI_SHM=0
//    (MPI), treat these tensors as ordinary ones.
//  - The memory counts against /dev/shm; empty() raises DistBackendError when it is full.

#include <cstddef>

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

namespace tdist::symmetric_memory {

/// An uninitialised CPU tensor of `sizes` in symmetric memory (options: dtype; CPU only).
at::Tensor empty(at::IntArrayRef sizes, at::TensorOptions options = {});

/// `bytes` (at least one page) of symmetric memory, owned by the returned pointer, for callers
/// that build storages themselves (FSDP's buffer pool); raises DistBackendError when /dev/shm
/// cannot hold them.
at::DataPtr allocate(size_t bytes);

/// True when `t`'s bytes lie inside one symmetric-memory allocation of this process.
bool is_symmetric(const at::Tensor& t);

/// Whether symmetric memory can be allocated here (POSIX shared memory usable, not turned off
/// with TDIST_GLOO_SHM=0).
bool is_available();

}  // namespace tdist::symmetric_memory

#pragma once

// BufferPool: the memory behind FSDP's per-step collective buffers and unsharded parameters.
//
// Note [Buffer pool]
// Every step each group needs, for a few milliseconds each, an all-gather output, an
// unsharded parameter block and a reduce-scatter input, all world * total elements. Taking
// them from malloc each time costs page faults (a fresh 3 MB buffer is ~800 faults, each
// zeroing a page) and, with glibc, heap growth and fragmentation; this pool recycles them
// instead, as PyTorch's caching allocator does for FSDP on GPUs. A released block stays
// cached only while the idle bytes are below a cap (kIdleBlocks times the largest request, or
// kIdleFloorBytes when that is more); beyond it the block is really freed. The storage that used a
// block holds 0 bytes once it is released (Note [Freeing unsharded storage]): what the pool keeps
// is reused by the next group's unshard, never read through the old storage.

#include <cstddef>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include "tdist/comm/process_group.h"

namespace tdist::fsdp::detail {

struct PooledBlock {
  at::DataPtr data;
  size_t capacity = 0;     // bytes usable through data
  bool symmetric = false;  // data is symmetric memory (Note [Pooled blocks in symmetric memory])
  explicit operator bool() const { return static_cast<bool>(data); }
};

class BufferPool {
 public:
  /// Idle blocks kept, in units of the largest request seen. Two is what a steady step of
  /// equal-sized groups reuses (the all-gather output released at copy-out and the
  /// unsharded block released at reshard are taken by the next group's all-gather and
  /// unshard); every idle block more is memory at the activation peak (four did not fit
  /// bench_fsdp_1b's cap).
  static constexpr size_t kIdleBlocks = 2;
  /// Idle bytes always allowed, whatever the request sizes: models of small groups then
  /// never free a block in the steady state (Note [Pooled blocks in symmetric memory]: a
  /// fresh block is a new shared-memory object that every peer maps again).
  static constexpr size_t kIdleFloorBytes = size_t(64) << 20;

  /// A block of at least `nbytes` on `device` (CPU only), cached or newly allocated, in
  /// symmetric memory when `symmetric` (ordinary memory, with a warning, when /dev/shm is
  /// full).
  PooledBlock acquire(size_t nbytes, c10::Device device, bool symmetric = false);
  /// Returns a block; keeps it for reuse or frees it (Note [Buffer pool]).
  void release(PooledBlock&& block);
  size_t idle_bytes() const;

 private:
  mutable std::mutex mutex_;
  std::vector<PooledBlock> idle_;  // oldest first
  size_t idle_bytes_ = 0;
  size_t largest_ = 0;
};

/// The process-wide pool.
BufferPool& buffer_pool();

/// A group's flat shard (Note [Persistent buffers]) and whether the group's pooled buffers
/// are symmetric.
struct FlatShard {
  at::Tensor tensor;  // numel zeros
  bool symmetric = false;
};

/// Allocates a group's flat shard of `numel` elements, in symmetric memory when every rank
/// of `group` is allowed to (`symmetric_allowed`: FSDPEnvironment::symmetric_buffers) and can
/// hold it and `pooled_bytes` per pooled buffer there (one MIN all_reduce over `group`: every
/// rank must call it, in the same order, as fully_shard is).
FlatShard allocate_flat_shard(int64_t numel, size_t pooled_bytes, const at::TensorOptions& options,
                              const ProcessGroupPtr& group, bool symmetric_allowed);

/// A 1-D tensor whose StorageImpl (and so every tensor made from it) lives across steps while
/// its bytes come from the pool only between acquire() and release().
class PooledTensor {
 public:
  void init(int64_t numel, const at::TensorOptions& options, bool symmetric);
  void acquire();  // no-op when held
  void release();  // no-op when not held
  bool held() const { return held_; }
  const at::Tensor& tensor() const { return tensor_; }
  char* data() const { return static_cast<char*>(tensor_.data_ptr()); }

 private:
  at::Tensor tensor_;
  size_t nbytes_ = 0;
  size_t capacity_ = 0;
  bool symmetric_ = false;        // asked for
  bool block_symmetric_ = false;  // what the held block is
  bool held_ = false;
};

}  // namespace tdist::fsdp::detail

#include "fsdp/buffer_pool.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <string>

#include <ATen/ATen.h>

#include "tdist/comm/distributed.h"
#include "tdist/comm/symmetric_memory.h"
#include "tdist/detail/util/torch_compat.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {

namespace {

// Note [Pooled blocks in symmetric memory]: a group's flat shard (the all-gather input) and
// its pooled buffers (all-gather output, unsharded block, reduce-scatter input) live in
// symmetric memory (tdist/comm/symmetric_memory.h) when every rank of the group can have
// them, so the same-host paths of the Gloo engine and the MPI backend read the peers'
// shards and reduce-scatter inputs in place instead of staging them through their segments
// (bench/HISTORY.md: those collectives are faster in isolation; on a
// 2-core machine the FSDP step's gain is within its run-to-run noise). A collective
// needs the same choice on every rank (a mix raises), hence one MIN all_reduce per group at
// fully_shard over "TDIST_FSDP_SYMMETRIC allows it, the flat shard was allocated there, and
// /dev/shm has room for four of the group's pooled buffers". Should /dev/shm fill up later,
// a block falls back to ordinary memory with a warning, and its collective raises
// DistBackendError on every rank (the ranks disagree), never a hang; a flat shard is never
// reallocated, so it cannot.
PooledBlock allocate_block(size_t nbytes, c10::Device device, bool symmetric) {
  PooledBlock block;
  block.capacity = nbytes;
  if (symmetric && device.is_cpu()) {
    try {
      block.data = symmetric_memory::allocate(nbytes);
      block.symmetric = true;
      return block;
    } catch (const DistBackendError& e) {
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true)) {
        std::cerr << "tdist FSDP warning: " << e.what()
                  << "; this buffer uses ordinary memory, so collectives over it fail on every "
                     "rank. Free /dev/shm or set TDIST_FSDP_SYMMETRIC=0 on every rank\n";
      }
    }
  }
  block.data = c10::GetAllocator(device.type())->allocate(nbytes);
  return block;
}

size_t shm_free_bytes() {
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) != 0) return 0;
  return static_cast<size_t>(fs.f_bavail) * fs.f_frsize;
}

}  // namespace

PooledBlock BufferPool::acquire(size_t nbytes, c10::Device device, bool symmetric) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    largest_ = std::max(largest_, nbytes);
    // Best fit: the smallest idle block that is large enough (groups of one model mostly
    // share one size, so this is usually an exact match).
    size_t best = idle_.size();
    for (size_t i = 0; i < idle_.size(); ++i) {
      if (idle_[i].capacity >= nbytes && idle_[i].data.device() == device &&
          idle_[i].symmetric == symmetric &&
          (best == idle_.size() || idle_[i].capacity < idle_[best].capacity)) {
        best = i;
      }
    }
    if (best != idle_.size()) {
      PooledBlock block = std::move(idle_[best]);
      idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(best));
      idle_bytes_ -= block.capacity;
      return block;
    }
  }
  return allocate_block(nbytes, device, symmetric);
}

void BufferPool::release(PooledBlock&& block) {
  if (!block) return;
  PooledBlock freed;  // destroyed outside the lock
  std::vector<PooledBlock> evicted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t cap = std::max(kIdleBlocks * largest_, kIdleFloorBytes);
    if (block.capacity > cap) {
      freed = std::move(block);
    } else {
      idle_bytes_ += block.capacity;
      idle_.push_back(std::move(block));
      while (idle_bytes_ > cap && !idle_.empty()) {
        idle_bytes_ -= idle_.front().capacity;
        evicted.push_back(std::move(idle_.front()));
        idle_.erase(idle_.begin());
      }
    }
  }
}

size_t BufferPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_bytes_;
}

FlatShard allocate_flat_shard(int64_t numel, size_t pooled_bytes, const at::TensorOptions& options,
                              const ProcessGroupPtr& group, bool symmetric_allowed) {
  FlatShard shard;
  bool fresh_shm = false;
  if (options.device().is_cpu() && symmetric_allowed) {
    try {
      shard.tensor = symmetric_memory::empty({numel}, options);
      fresh_shm = true;
      shard.symmetric = shm_free_bytes() >= 4 * pooled_bytes;
    } catch (const DistBackendError&) {
      shard.tensor = at::Tensor();  // /dev/shm full here: every rank falls back below
    }
  }
  at::Tensor everyone =
      to_collective_device(at::full({1}, shard.symmetric ? 1 : 0, at::kInt), group);
  all_reduce(everyone, ReduceOp::MIN, group);
  if (everyone.item<int>() == 0) {
    shard.symmetric = false;
    shard.tensor = at::empty({numel}, options);
    fresh_shm = false;
  }
  // A new shared-memory object reads as zeros already (ftruncate + fallocate): zeroing it
  // again would write every page of the model's shards once more before they are filled.
  if (!fresh_shm) shard.tensor.zero_();
  return shard;
}

BufferPool& buffer_pool() {
  static BufferPool* pool = new BufferPool();  // leaked: blocks may be released at exit
  return *pool;
}

void PooledTensor::init(int64_t numel, const at::TensorOptions& options, bool symmetric) {
  tensor_ = util::unallocated({numel}, options);
  symmetric_ = symmetric;
  nbytes_ = tensor_.nbytes();
  held_ = false;
}

void PooledTensor::acquire() {
  if (held_) return;
  PooledBlock block = buffer_pool().acquire(nbytes_, tensor_.device(), symmetric_);
  capacity_ = block.capacity;
  block_symmetric_ = block.symmetric;
  util::give_storage(tensor_, std::move(block.data), nbytes_);
  held_ = true;
}

void PooledTensor::release() {
  if (!held_) return;
  PooledBlock block;
  block.data = util::take_storage(tensor_);
  block.capacity = capacity_;
  block.symmetric = block_symmetric_;
  held_ = false;
  buffer_pool().release(std::move(block));
}

}  // namespace tdist::fsdp::detail

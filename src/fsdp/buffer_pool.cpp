#include "fsdp/buffer_pool.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>

#include <ATen/ATen.h>

#include "comm/symmetric_registry.h"
#include "tdist/comm/symmetric_memory.h"
#include "tdist/error.h"
#include "tdist/util/torch_compat.h"

namespace tdist::fsdp::detail {

namespace {

// Note [Pooled blocks in symmetric memory]: on CPU the pool's blocks are symmetric memory
// (tdist/comm/symmetric_memory.h), so a group's all-gather output and reduce-scatter input
// are too, on every rank, as are the flat shards (flat_shard_zeros, the all-gather input),
// and the same-host paths of the Gloo engine and the MPI backend read the peers' buffers in
// place instead of staging them through their segments (bench_fsdp: full shard's median
// step 1.12x DDP's in ordinary memory, 1.05x here; bench/RESULTS.md, session 8). Every block
// of the process comes from here (one kind per process), so every rank of a collective
// passes the same kind as long as TDIST_FSDP_SYMMETRIC is the same everywhere. When
// /dev/shm is full a block falls back to ordinary memory with a warning: its collective then
// raises DistBackendError on every rank (the ranks disagree), never a hang.
at::DataPtr allocate_block(size_t nbytes, c10::Device device) {
  if (device.is_cpu() && symmetric_blocks_enabled()) {
    try {
      return ::tdist::detail::allocate_symmetric(nbytes);
    } catch (const DistBackendError& e) {
      static bool warned = false;
      if (!warned) {
        warned = true;
        std::cerr << "tdist FSDP warning: " << e.what()
                  << "; this buffer uses ordinary memory, so collectives over it fail on every "
                     "rank. Free /dev/shm or set TDIST_FSDP_SYMMETRIC=0 on every rank\n";
      }
    }
  }
  return c10::GetAllocator(device.type())->allocate(nbytes);
}

}  // namespace

bool symmetric_blocks_enabled() {
  const char* env = std::getenv("TDIST_FSDP_SYMMETRIC");
  if (env != nullptr && std::string(env) == "0") return false;
  if (env != nullptr && std::string(env) != "1") {
    TDIST_THROW(InvalidArgument, std::string("TDIST_FSDP_SYMMETRIC='") + env +
                                     "': expected 0 (off) or 1 (on, the default)");
  }
  return symmetric_memory::is_available();
}

PooledBlock BufferPool::acquire(size_t nbytes, c10::Device device) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    largest_ = std::max(largest_, nbytes);
    // Best fit: the smallest idle block that is large enough (groups of one model mostly
    // share one size, so this is usually an exact match).
    size_t best = idle_.size();
    for (size_t i = 0; i < idle_.size(); ++i) {
      if (idle_[i].capacity >= nbytes && idle_[i].data.device() == device &&
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
  PooledBlock block;
  block.data = allocate_block(nbytes, device);
  block.capacity = nbytes;
  return block;
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

// On by default since session 5: with the idle cache at two blocks (kIdleBlocks) the
// 1.02e9-parameter GPT of bench_fsdp_1b trains under its 9.8 GiB per-rank cap with them
// (bench/RESULTS.md). "0" keeps the general path (a fresh allocation per collective).
bool persistent_buffers_enabled() {
  const char* env = std::getenv("TDIST_FSDP_PERSISTENT_BUFFERS");
  if (env == nullptr || std::string(env) == "1") return true;
  if (std::string(env) == "0") return false;
  TDIST_THROW(InvalidArgument, std::string("TDIST_FSDP_PERSISTENT_BUFFERS='") + env +
                                   "': expected 0 (off) or 1 (on, the default)");
}

// A rank whose flat shard falls back to ordinary memory still agrees with its peers: it
// announces its all-gather output block instead (symmetric too, from the pool).
at::Tensor flat_shard_zeros(int64_t numel, const at::TensorOptions& options) {
  if (options.device().is_cpu() && symmetric_blocks_enabled()) {
    try {
      return symmetric_memory::empty({numel}, options).zero_();
    } catch (const DistBackendError&) {
    }
  }
  return at::zeros({numel}, options);
}

BufferPool& buffer_pool() {
  static BufferPool* pool = new BufferPool();  // leaked: blocks may be released at exit
  return *pool;
}

void PooledTensor::init(int64_t numel, const at::TensorOptions& options) {
  tensor_ = util::unallocated({numel}, options);
  nbytes_ = tensor_.nbytes();
  held_ = false;
}

void PooledTensor::acquire() {
  if (held_) return;
  PooledBlock block = buffer_pool().acquire(nbytes_, tensor_.device());
  capacity_ = block.capacity;
  util::give_storage(tensor_, std::move(block.data), nbytes_);
  held_ = true;
}

void PooledTensor::release() {
  if (!held_) return;
  PooledBlock block;
  block.data = util::take_storage(tensor_);
  block.capacity = capacity_;
  held_ = false;
  buffer_pool().release(std::move(block));
}

}  // namespace tdist::fsdp::detail

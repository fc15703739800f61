#pragma once

// Process memory as the OS sees it (resident set), read from /proc/self/status, and GPU
// memory as LibTorch's CUDA caching allocator counts it.

#include <cstdint>

#include <c10/core/Device.h>

namespace gpt {

struct MemoryUsage {
  int64_t rss_bytes = 0;   ///< VmRSS: resident now
  int64_t peak_bytes = 0;  ///< VmHWM: peak resident since start
};

/// Zeros where /proc is unavailable.
MemoryUsage memory_usage();

struct DeviceMemoryUsage {
  int64_t allocated_bytes = 0;  ///< handed out to tensors now (torch.cuda.memory_allocated)
  int64_t peak_bytes = 0;       ///< the most since start (torch.cuda.max_memory_allocated)
};

/// Zeros for the CPU, and in builds whose LibTorch has no CUDA.
DeviceMemoryUsage device_memory_usage(const c10::Device& device);

}  // namespace gpt

#pragma once

// Process memory as the OS sees it (resident set), read from /proc/self/status.

#include <cstdint>

namespace gpt {

struct MemoryUsage {
  int64_t rss_bytes = 0;   ///< VmRSS: resident now
  int64_t peak_bytes = 0;  ///< VmHWM: peak resident since start
};

/// Zeros where /proc is unavailable.
MemoryUsage memory_usage();

}  // namespace gpt

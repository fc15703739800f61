#include "gpt/memory.h"

#include <fstream>
#include <string>

#ifdef TDIST_GPT_CUDA_MEMORY
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace gpt {

MemoryUsage memory_usage() {
  MemoryUsage usage;
  std::ifstream in("/proc/self/status");
  std::string line;
  auto kib = [](const std::string& l) {
    return std::stoll(l.substr(l.find(':') + 1)) * 1024;  // "VmRSS:   1234 kB"
  };
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) usage.rss_bytes = kib(line);
    if (line.rfind("VmHWM:", 0) == 0) usage.peak_bytes = kib(line);
  }
  return usage;
}

DeviceMemoryUsage device_memory_usage(const c10::Device& device) {
  DeviceMemoryUsage usage;
#ifdef TDIST_GPT_CUDA_MEMORY
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto& bytes =
        stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    usage.allocated_bytes = bytes.current;
    usage.peak_bytes = bytes.peak;
  }
#else
  (void)device;
#endif
  return usage;
}

}  // namespace gpt

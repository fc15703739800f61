#include "gpt/memory.h"

#include <fstream>
#include <string>

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

}  // namespace gpt

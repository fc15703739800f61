// libFuzzer target for tdistrun's command line (tdist::launch::parse_launch_args,
// src/launch/launch_config.cpp), whose values come from job scripts and schedulers. The
// input is the arguments separated by NUL bytes. Properties: it never throws (its contract);
// a configuration it accepts names a program and has a positive worker count and node range.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tdist/launch/launch_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args = {"tdistrun"};
  std::string current;
  for (size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == '\0') {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (!current.empty()) args.push_back(current);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  const auto parsed = tdist::launch::parse_launch_args(static_cast<int>(args.size()), argv.data());
  if (parsed.config) {
    const auto& c = *parsed.config;
    if (c.program.empty() || c.nproc_per_node < 1 || c.min_nodes < 1 || c.max_nodes < c.min_nodes) {
      std::abort();
    }
  }
  return 0;
}

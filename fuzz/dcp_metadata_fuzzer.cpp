// libFuzzer target for the `.metadata` of PyTorch's distributed checkpoint past the pickle
// layer (src/checkpoint/dcp_metadata.cpp: the Metadata dataclass, its chunk and storage
// records, tdist's extra-state entry), as load() reads it from a directory someone else
// wrote. Property: any file either decodes or raises tdist::Error (CheckpointError naming
// the file); what decodes has chunks inside their tensors' shapes.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "checkpoint/dcp_metadata.h"
#include "tdist/error.h"

namespace {

const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    const std::string d = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                          "/tdist_dcp_metadata_fuzz_" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = checkpoint_dir() + "/.metadata";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  tdist::checkpoint::CheckpointMetadata metadata;
  try {
    metadata = tdist::checkpoint::detail::read_dcp_metadata(checkpoint_dir());
  } catch (const tdist::Error&) {
    return 0;
  }
  for (const auto& [name, tensor] : metadata.tensors) {
    for (const auto& chunk : tensor.chunks) {
      if (chunk.offsets.size() != tensor.global_shape.size() ||
          chunk.sizes.size() != tensor.global_shape.size()) {
        std::abort();
      }
      for (size_t d = 0; d < chunk.sizes.size(); ++d) {
        if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 ||
            chunk.offsets[d] > tensor.global_shape[d] - chunk.sizes[d]) {
          std::abort();
        }
      }
    }
  }
  return 0;
}

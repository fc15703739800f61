// libFuzzer target for safetensors files as from_pretrained and the checkpoint interchange
// read them (tdist::checkpoint::SafetensorsFile, src/checkpoint/safetensors_file.cpp).
// Properties: any bytes either open (the header validated: JSON, dtypes, shapes, offsets
// inside the file, no overlaps) or raise tdist::Error; every tensor of a file that opens
// reads whole in its own dtype and converted to float32 without an overread
// (AddressSanitizer) or undefined behaviour (UBSan).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include <ATen/ATen.h>

#include "tdist/checkpoint/safetensors_file.h"
#include "tdist/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("safetensors-fuzz", 0);
  if (fd < 0 || write(fd, data, size) != static_cast<ssize_t>(size)) abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    tdist::checkpoint::SafetensorsFile file(path);
    for (const auto& [name, entry] : file.entries()) {
      int64_t numel = 1;
      for (int64_t d : entry.shape) numel *= d;
      if (numel > (int64_t(1) << 20)) continue;  // the offsets were checked; reading is the same
      file.read_rows(name, 0, at::empty(entry.shape, at::TensorOptions().dtype(entry.dtype)));
      if (at::isFloatingType(entry.dtype) && !entry.shape.empty()) {
        file.read_rows(name, 0, at::empty(entry.shape, at::kFloat));
      }
    }
  } catch (const tdist::Error&) {
  }
  close(fd);
  return 0;
}

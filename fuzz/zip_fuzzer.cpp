// libFuzzer target for the zip reader that checks every record of a torch.save archive
// (src/checkpoint/zip_check.cpp). Property: any bytes either pass or raise tdist::Error
// (CheckpointError); never a crash, an overread (AddressSanitizer), undefined behaviour
// (UBSan) or another exception.
#include <cstddef>
#include <cstdint>

#include "checkpoint/zip_check.h"
#include "tdist/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tdist::checkpoint::detail::check_zip_crcs(data, size, "fuzz input");
  } catch (const tdist::Error&) {
  }
  return 0;
}

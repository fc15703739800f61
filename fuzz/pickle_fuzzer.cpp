// libFuzzer target for the pickle reader behind PyTorch interchange (the `.metadata` of
// distributed checkpoints, src/checkpoint/pickle_reader.cpp). Property: any bytes either
// read as a pickle or raise tdist::Error (CheckpointError); never a crash, an overread
// (AddressSanitizer), undefined behaviour (UBSan), another exception (a std::bad_alloc from a
// length taken on trust would escape and fail the run) or an unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/pickle_reader.h"
#include "tdist/error.h"

using tdist::checkpoint::detail::PyRef;
using tdist::checkpoint::detail::unpickle;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const bool allow_some = size > 0 && (data[0] & 1) != 0;
  try {
    PyRef value = unpickle(
        bytes,
        [&](const std::string& name) {
          return allow_some && name.rfind("torch.distributed.checkpoint", 0) == 0;
        },
        "fuzz input");
    // Every node built is read once (AddressSanitizer checks each); a cycle would leak its
    // nodes, which LeakSanitizer reports (Note [No cycles] in pickle_reader.cpp).
    tdist::checkpoint::detail::for_each_reachable({value}, [](const auto& v) { (void)v.kind; });
  } catch (const tdist::Error&) {
  }
  return 0;
}

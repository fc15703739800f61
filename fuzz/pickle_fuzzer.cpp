// libFuzzer target for the pickle reader behind PyTorch interchange (the `.metadata` of
// distributed checkpoints, src/checkpoint/pickle_reader.cpp). Property: any bytes either
// read as a pickle or raise tdist::Error (CheckpointError); never a crash, an overread
// (AddressSanitizer), undefined behaviour (UBSan), another exception (a std::bad_alloc from a
// length taken on trust would escape and fail the run) or an unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "checkpoint/pickle_reader.h"
#include "tdist/error.h"

using tdist::checkpoint::detail::PyRef;
using tdist::checkpoint::detail::PyValue;
using tdist::checkpoint::detail::unpickle;

namespace {

// Touches every node built, each once (values may be shared; Note [No cycles] in
// pickle_reader.cpp: a cycle would make this loop, and LeakSanitizer report its nodes).
size_t count_nodes(const PyRef& root) {
  std::unordered_set<const PyValue*> seen;
  std::vector<const PyValue*> pending{root.get()};
  while (!pending.empty()) {
    const PyValue* v = pending.back();
    pending.pop_back();
    if (v == nullptr || !seen.insert(v).second) continue;
    for (const auto& item : v->items) pending.push_back(item.get());
    for (const auto& [k, value] : v->entries) {
      pending.push_back(k.get());
      pending.push_back(value.get());
    }
    pending.push_back(v->state.get());
  }
  return seen.size();
}

}  // namespace

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
    count_nodes(value);
  } catch (const tdist::Error&) {
  }
  return 0;
}

#pragma once

// One rank's data file of a checkpoint in PyTorch's distributed checkpoint format:
// __<rank>_0.distcp, each slice a torch.save of it at an offset, as FileSystemWriter
// lays it out (one file per rank, thread_count=1).

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

namespace tdist::checkpoint::detail {

/// A slice this rank owns in the save plan.
struct SliceToWrite {
  std::string name;
  std::vector<int64_t> offsets;
  at::Tensor data;
};

/// Writes `slices` (and, when given, the extra-state JSON as a torch.save'd string, and
/// each of `objects` torch.save'd) into `dir`/__<rank>_0.distcp; `halfway` runs after about
/// half the bytes (fault injection). Returns the records save() gathers: {"file": {...} or
/// null, "chunks": [...], "extra_state": {file, offset, length} when written, "objects":
/// [{name, file, offset, length}]}.
nlohmann::json write_dcp_file(const std::vector<SliceToWrite>& slices,
                              const std::string* extra_state_json,
                              const std::vector<std::pair<std::string, c10::IValue>>& objects,
                              int rank, const std::string& dir, bool fsync,
                              const std::function<void()>& halfway);

}  // namespace tdist::checkpoint::detail

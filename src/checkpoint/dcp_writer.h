#pragma once

// One rank's data file of a checkpoint in PyTorch's distributed checkpoint format:
// __<rank>_0.distcp, each slice a torch.save of it at an offset, as FileSystemWriter
// lays it out (one file per rank, thread_count=1).

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace tdist::checkpoint::detail {

/// A slice this rank owns in the save plan.
struct SliceToWrite {
  std::string name;
  std::vector<int64_t> offsets;
  at::Tensor data;
};

/// Writes `slices` (and, when given, the extra-state JSON as a torch.save'd string) into
/// `dir`/__<rank>_0.distcp; `halfway` runs after about half the bytes (fault injection).
/// Returns the records save() gathers: {"file": {...} or null, "chunks": [...],
/// "extra_state": {file, offset, length} when written}.
nlohmann::json write_dcp_file(const std::vector<SliceToWrite>& slices,
                              const std::string* extra_state_json, int rank, const std::string& dir,
                              bool fsync, const std::function<void()>& halfway);

}  // namespace tdist::checkpoint::detail

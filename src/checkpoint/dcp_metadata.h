#pragma once

// The `.metadata` of PyTorch's distributed checkpoint (torch.distributed.checkpoint's
// FileSystemWriter): a pickle of its Metadata dataclass. Written with exactly the fields
// Python's reader needs; read through pickle_reader's allow-list into a CheckpointMetadata.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

#include "tdist/checkpoint/metadata.h"

namespace tdist::checkpoint::detail {

/// The entry (BytesStorageMetadata) holding every saving rank's ExtraState as one JSON
/// array, torch.save'd as a string; Python sees it as one more key and ignores it.
constexpr const char* kDCPExtraStateKey = "tdist.extra_state";

/// Where a byte entry lies in the checkpoint's files.
struct DCPByteEntry {
  std::string file;
  int64_t offset = 0;
  int64_t length = 0;
};

/// A non-tensor value of the state dict (BytesStorageMetadata: a torch.save of it).
struct DCPObjectEntry {
  std::string name;  // flattened, as Python's flatten_state_dict names it
  DCPByteEntry where;
};

/// Python's flattening of optimizer param groups (ExtraState::optimizer_param_groups): one
/// value per group and option, "optim.param_groups.<i>.<key>"; "params" a list of names,
/// other lists (betas) tuples.
std::vector<std::pair<std::string, c10::IValue>> dcp_param_group_values(
    const nlohmann::json& groups);

/// The pickle for `metadata`'s tensors (each chunk a torch.save blob in its file), plus
/// the extra-state entry when given and `objects` (param groups). `checkpoint_id` and
/// `save_id` go to StorageMeta.
std::string encode_dcp_metadata(const CheckpointMetadata& metadata,
                                const std::optional<DCPByteEntry>& extra_state,
                                const std::vector<DCPObjectEntry>& objects,
                                const std::string& checkpoint_id, const std::string& save_id);

/// Reads <dir>/.metadata (and the extra-state entry when present). A checkpoint Python
/// wrote has no extra state; its optimizer param groups ("optim.param_groups.<i>.<key>")
/// become extra_per_rank = {ExtraState with optimizer_param_groups}. Other byte entries are
/// skipped: tdist loads tensors.
CheckpointMetadata read_dcp_metadata(const std::string& dir);

/// The name's place in a nested state dict, as Python's flatten_state_dict records it:
/// "model.<fqn>" -> (model, fqn), "optim.state.<fqn>.<key>" -> (optim, state, fqn, key).
std::vector<std::string> dcp_state_dict_path(const std::string& name);

}  // namespace tdist::checkpoint::detail

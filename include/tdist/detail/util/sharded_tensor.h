#pragma once

// The one description of "a slice of a bigger tensor" that FSDP state dicts, DDP/plain
// state dicts and checkpoints exchange. A plain (unsharded) tensor is a ShardedTensor whose
// local part is the whole tensor at offset 0.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tdist {

struct ShardedTensor {
  /// This rank's piece, unpadded: exactly the elements this rank owns (may be empty).
  at::Tensor local;
  /// Shape of the whole tensor across all ranks.
  std::vector<int64_t> global_shape;
  /// Offset of `local` in the whole tensor, per dimension (FSDP: along its shard dim).
  std::vector<int64_t> offsets;

  /// A tensor owned whole by this rank.
  static ShardedTensor whole(const at::Tensor& t) {
    return ShardedTensor{t, t.sizes().vec(), std::vector<int64_t>(t.dim(), 0)};
  }
};

/// Name -> slice, e.g. "layers.0.attn.qkv.weight" or "optim.state.3.exp_avg".
using ShardedStateDict = std::map<std::string, ShardedTensor>;

}  // namespace tdist

#pragma once

// The arithmetic of dim-0 sharding with padding, shared by every FSDP piece and by the
// state dicts. Pure: no tensors, no communication.
//
// Note [Dim-0 padding]
// A parameter of shape [d0, r1, r2, ...] is split into `world` row-chunks of
// shard_rows = ceil(d0 / world) rows each (a scalar is treated as shape [1]). Rank i owns
// rows [i * shard_rows, min((i+1) * shard_rows, d0)): possibly fewer than shard_rows (the
// last ranks), possibly none. Each rank stores a *padded* chunk of exactly shard_rows rows so
// that every rank sends the same number of elements to all-gather and reduce-scatter; the
// unsharded parameter is the first d0 rows of the padded [world * shard_rows, ...] tensor.
// Optimizers see only the unpadded local rows.

#include <cstdint>
#include <vector>

namespace tdist::fsdp {

struct ShardLayout {
  std::vector<int64_t> shape;  // the whole (unsharded) parameter's shape
  int world = 1;
  int rank = 0;
  int64_t dim0 = 0;        // rows of the whole parameter (1 for a scalar)
  int64_t row_numel = 1;   // elements per row (product of shape[1:])
  int64_t shard_rows = 0;  // padded rows every rank stores: ceil(dim0 / world)
  int64_t local_rows = 0;  // rows this rank really owns (0..shard_rows)
  int64_t row_offset = 0;  // first row this rank owns (clamped to dim0)

  int64_t numel() const { return dim0 * row_numel; }
  /// Elements every rank contributes to an all-gather (padded shard).
  int64_t padded_shard_numel() const { return shard_rows * row_numel; }
  /// Elements this rank really owns.
  int64_t local_numel() const { return local_rows * row_numel; }
  /// Rows of the padded unsharded tensor (world * shard_rows >= dim0).
  int64_t padded_rows() const { return shard_rows * world; }
  /// Shape of this rank's unpadded shard: [local_rows, shape[1:]...].
  std::vector<int64_t> local_shape() const;
  /// Shape of the padded shard: [shard_rows, shape[1:]...].
  std::vector<int64_t> padded_shard_shape() const;
  /// Shape of the padded unsharded tensor: [world * shard_rows, shape[1:]...].
  std::vector<int64_t> padded_unsharded_shape() const;

  /// Throws InvalidArgument for world < 1, rank outside [0, world) or a negative dim.
  static ShardLayout compute(const std::vector<int64_t>& shape, int world, int rank);
};

}  // namespace tdist::fsdp

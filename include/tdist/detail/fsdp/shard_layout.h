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
//
// Note [Sharding on another dim]
// With shard_placement_fn's Shard(d), d > 0, the same arithmetic runs on the parameter with
// dim d moved to the front (moved_shape): "rows" are slices along d, and the padded shard,
// the all-gather and reduce-scatter buffers and the padded unsharded tensor all live in that
// moved layout, so the collectives and buffers are those of dim 0. Only what the parameter
// shows is permuted back: at rest P is the moved shard's view with dim 0 moved to d (shape
// [..., local_rows at d, ...], not contiguous unless its other leading dims are 1), while
// unsharded P is the moved padded tensor's first dim0 rows, viewed likewise. Uneven sizes
// pad along d (PyTorch 2.11 refuses them there).

#include <cstdint>
#include <vector>

namespace tdist::fsdp {

struct ShardLayout {
  std::vector<int64_t> shape;  // the whole (unsharded) parameter's shape
  int world = 1;
  int rank = 0;
  int64_t shard_dim = 0;   // the dim sharded (Note [Sharding on another dim])
  int64_t dim0 = 0;        // rows of the whole parameter: shape[shard_dim] (1 for a scalar)
  int64_t row_numel = 1;   // elements per row (product of the other dims)
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
  /// The shape with shard_dim moved to the front ([1] for a scalar); the shape itself for
  /// dim 0. The shapes below are in this layout: [rows, the other dims...].
  std::vector<int64_t> moved_shape() const;
  /// Shape of this rank's unpadded shard: [local_rows, other dims...].
  std::vector<int64_t> local_shape() const;
  /// Shape of the padded shard: [shard_rows, other dims...].
  std::vector<int64_t> padded_shard_shape() const;
  /// Shape of the padded unsharded tensor: [world * shard_rows, other dims...].
  std::vector<int64_t> padded_unsharded_shape() const;
  /// This rank's unpadded shard as the parameter shows it: shape with local_rows at
  /// shard_dim (local_shape() for dim 0).
  std::vector<int64_t> param_local_shape() const;

  /// Throws InvalidArgument for world < 1, rank outside [0, world), a negative dim or a
  /// shard dim outside the shape.
  static ShardLayout compute(const std::vector<int64_t>& shape, int world, int rank,
                             int64_t shard_dim = 0);
};

}  // namespace tdist::fsdp

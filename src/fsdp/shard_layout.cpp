#include "tdist/detail/fsdp/shard_layout.h"

#include <algorithm>
#include <string>

#include "tdist/error.h"

namespace tdist::fsdp {

namespace {
std::vector<int64_t> with_rows(const std::vector<int64_t>& shape, int64_t rows) {
  std::vector<int64_t> out = shape.empty() ? std::vector<int64_t>{1} : shape;
  out[0] = rows;
  return out;
}
}  // namespace

std::vector<int64_t> ShardLayout::local_shape() const {
  return with_rows(shape, local_rows);
}
std::vector<int64_t> ShardLayout::padded_shard_shape() const {
  return with_rows(shape, shard_rows);
}
std::vector<int64_t> ShardLayout::padded_unsharded_shape() const {
  return with_rows(shape, padded_rows());
}

ShardLayout ShardLayout::compute(const std::vector<int64_t>& shape, int world, int rank) {
  TDIST_CHECK_ARG(world >= 1, "ShardLayout: world size must be >= 1, got " + std::to_string(world));
  TDIST_CHECK_ARG(rank >= 0 && rank < world, "ShardLayout: rank " + std::to_string(rank) +
                                                 " is outside [0, " + std::to_string(world) + ")");
  ShardLayout layout;
  layout.shape = shape;
  layout.world = world;
  layout.rank = rank;
  layout.dim0 = shape.empty() ? 1 : shape[0];
  layout.row_numel = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    TDIST_CHECK_ARG(shape[d] >= 0, "ShardLayout: negative size in dim " + std::to_string(d));
    if (d > 0) layout.row_numel *= shape[d];
  }
  layout.shard_rows = (layout.dim0 + world - 1) / world;  // Note [Dim-0 padding]
  layout.row_offset =
      std::min<int64_t>(static_cast<int64_t>(rank) * layout.shard_rows, layout.dim0);
  layout.local_rows = std::min<int64_t>(layout.shard_rows, layout.dim0 - layout.row_offset);
  return layout;
}

}  // namespace tdist::fsdp

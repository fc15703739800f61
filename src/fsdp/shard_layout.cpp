#include "tdist/detail/fsdp/shard_layout.h"

#include <algorithm>
#include <string>

#include "tdist/error.h"

namespace tdist::fsdp {

namespace {
std::vector<int64_t> with_rows(const ShardLayout& layout, int64_t rows) {
  std::vector<int64_t> out = layout.moved_shape();
  out[0] = rows;
  return out;
}
}  // namespace

std::vector<int64_t> ShardLayout::moved_shape() const {
  if (shape.empty()) return {1};
  std::vector<int64_t> out = {shape[shard_dim]};
  for (size_t d = 0; d < shape.size(); ++d) {
    if (static_cast<int64_t>(d) != shard_dim) out.push_back(shape[d]);
  }
  return out;
}

std::vector<int64_t> ShardLayout::local_shape() const {
  return with_rows(*this, local_rows);
}
std::vector<int64_t> ShardLayout::padded_shard_shape() const {
  return with_rows(*this, shard_rows);
}
std::vector<int64_t> ShardLayout::padded_unsharded_shape() const {
  return with_rows(*this, padded_rows());
}

std::vector<int64_t> ShardLayout::param_local_shape() const {
  std::vector<int64_t> out = shape;
  if (!out.empty()) out[shard_dim] = local_rows;
  return out;
}

ShardLayout ShardLayout::compute(const std::vector<int64_t>& shape, int world, int rank,
                                 int64_t shard_dim) {
  TDIST_CHECK_ARG(world >= 1, "ShardLayout: world size must be >= 1, got " + std::to_string(world));
  TDIST_CHECK_ARG(rank >= 0 && rank < world, "ShardLayout: rank " + std::to_string(rank) +
                                                 " is outside [0, " + std::to_string(world) + ")");
  const auto ndim = static_cast<int64_t>(shape.size());
  TDIST_CHECK_ARG(shard_dim == 0 || (shard_dim > 0 && shard_dim < ndim),
                  "ShardLayout: shard dim " + std::to_string(shard_dim) +
                      " is out of range for a tensor of " + std::to_string(ndim) + " dimension(s)");
  ShardLayout layout;
  layout.shape = shape;
  layout.world = world;
  layout.rank = rank;
  layout.shard_dim = shard_dim;
  layout.dim0 = shape.empty() ? 1 : shape[shard_dim];
  layout.row_numel = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    TDIST_CHECK_ARG(shape[d] >= 0, "ShardLayout: negative size in dim " + std::to_string(d));
    if (d != shard_dim) layout.row_numel *= shape[d];
  }
  layout.shard_rows = (layout.dim0 + world - 1) / world;  // Note [Dim-0 padding]
  layout.row_offset =
      std::min<int64_t>(static_cast<int64_t>(rank) * layout.shard_rows, layout.dim0);
  layout.local_rows = std::min<int64_t>(layout.shard_rows, layout.dim0 - layout.row_offset);
  return layout;
}

}  // namespace tdist::fsdp

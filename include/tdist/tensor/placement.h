#pragma once

// How a distributed tensor lies along one dimension of its device mesh, as
// torch.distributed.tensor's placements: Shard(dim) (split as torch.chunk splits it, so the
// last ranks may hold shorter or empty shards), Replicate() (every rank holds the whole
// tensor) and Partial(reduce_op) (every rank holds a value to be reduced: the tensor is the
// reduction of the ranks' local tensors).

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "tdist/comm/types.h"

namespace tdist::tensor {

struct Shard {
  explicit Shard(int64_t dim = 0) : dim(dim) {}
  int64_t dim;
  bool operator==(const Shard& other) const { return dim == other.dim; }
  bool operator!=(const Shard& other) const { return dim != other.dim; }
};

struct Replicate {
  bool operator==(const Replicate&) const { return true; }
  bool operator!=(const Replicate&) const { return false; }
};

struct Partial {
  explicit Partial(ReduceOp reduce_op = ReduceOp::SUM) : reduce_op(reduce_op) {}
  ReduceOp reduce_op;
  bool operator==(const Partial& other) const { return reduce_op == other.reduce_op; }
  bool operator!=(const Partial& other) const { return reduce_op != other.reduce_op; }
};

using Placement = std::variant<Shard, Replicate, Partial>;
/// One placement per mesh dimension, outermost first.
using Placements = std::vector<Placement>;

bool is_shard(const Placement& placement);
bool is_shard(const Placement& placement, int64_t dim);
bool is_replicate(const Placement& placement);
bool is_partial(const Placement& placement);
/// The tensor dimension a Shard placement splits; throws InvalidArgument for the others.
int64_t shard_dim(const Placement& placement);

/// "Shard(dim=0)", "Replicate()", "Partial(sum)", as PyTorch prints them.
std::string to_string(const Placement& placement);
/// "(Shard(dim=0), Replicate())".
std::string to_string(const Placements& placements);

/// The length and offset of chunk `index` when a dimension of `size` is split into
/// `num_chunks` as torch.chunk splits it (chunks of ceil(size / num_chunks), the last ones
/// shorter or empty).
std::pair<int64_t, int64_t> local_shard_size_and_offset(int64_t size, int64_t num_chunks,
                                                        int64_t index);

/// The placements a gradient has (PyTorch's rule): Partial becomes Replicate, since every
/// rank receives the whole gradient of a value they reduce.
Placements normalize_placements_for_grad(const Placements& placements);

}  // namespace tdist::tensor

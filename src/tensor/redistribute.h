#pragma once

// Moving a local tensor between placements on a mesh: the plan (which mesh dimension changes
// in which order, Note [Redistribute order]) and the collective of each step. Stateless; the
// autograd functions of dtensor.cpp call it forward and, reversed, backward.

#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/mesh/device_mesh.h"
#include "tdist/tensor/dtensor.h"
#include "tdist/tensor/placement.h"

namespace tdist::tensor::detail {

/// This rank's local tensor of the global tensor of `global_shape` laid out as `to`, from
/// its local tensor laid out as `from`. Every rank of the mesh calls it with the same
/// arguments (but its own local tensor). No autograd: callers wrap it.
at::Tensor redistribute_local(const at::Tensor& local, const mesh::DeviceMesh& mesh,
                              const Placements& from, const Placements& to,
                              const std::vector<int64_t>& global_shape);

/// distribute_tensor's Shard step along one mesh dimension: `src`'s torch.chunk pieces of
/// dimension `d`, scattered over `group` (std::nullopt: each rank's own piece, no traffic).
at::Tensor scatter_shards(const at::Tensor& t, int64_t d, const ProcessGroupPtr& group,
                          std::optional<int> src);

/// Replicate -> Partial along one mesh dimension of `size` ranks: the value each rank keeps
/// so that the reduction gives the tensor back (SUM: divided by size; AVG, MIN, MAX: kept).
at::Tensor partition_value(const at::Tensor& replica, ReduceOp op, int64_t size);

/// `source`'s local tensor moved to `to`, in the autograd graph, with its gradient arriving
/// laid out as `grad`: one backward collective where redistribute + to_local(grad_placements)
/// would take two (a Partial gradient of a gathered shard: one reduce-scatter, not an
/// all-reduce and a chunk). The tensor-parallel styles' input moves.
at::Tensor moved_local(const DTensor& source, Placements to, Placements grad);

/// Shard dims made non-negative and checked against `ndim`; the count checked against the
/// mesh. `what` names the caller in errors.
Placements checked_placements(Placements placements, const mesh::DeviceMesh& mesh, int64_t ndim,
                              const char* what);

}  // namespace tdist::tensor::detail

#pragma once

// DTensor: a tensor distributed over a DeviceMesh (torch.distributed.tensor.DTensor, in
// LibTorch). It is a local tensor (this rank's part, an ordinary at::Tensor on which autograd
// runs), the mesh, one placement per mesh dimension, and the global shape and stride.
//
// Note [DTensor autograd]: a DTensor is not a tensor subclass here (LibTorch has no
// __torch_dispatch__), so computation happens on local tensors and the DTensor layer only
// moves data between placements. Every move is differentiable: redistribute's backward moves
// the gradient back (its transposed collective: an all-gather's backward is a local chunk, a
// chunk's an all-gather, a reduce-scatter's an all-gather, an all-to-all's the reverse
// all-to-all). As in PyTorch, the gradient of a local tensor is taken to lie in the DTensor's
// placements with Partial read as Replicate (normalize_placements_for_grad), unless
// to_local(grad_placements) says what the computation on the local tensor produces: a
// replicated input multiplied by a column shard gets a Partial gradient, and
// to_local({Partial()}) makes its backward all-reduce it (tensor parallelism's "f").

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include "tdist/mesh/device_mesh.h"
#include "tdist/tensor/placement.h"

namespace tdist::tensor {

struct FromLocalOptions {
  /// Check across ranks, at the cost of collectives, that the local tensors fit together
  /// (same dtype, rank and unsharded sizes; shard sizes as torch.chunk makes them), derive
  /// the global shape from the real shard sizes (uneven shards included), and broadcast the
  /// first rank's data along each Replicate dimension. A mismatch raises on every rank.
  TORCH_ARG(bool, run_check) = false;
  /// The global shape and stride; by default derived from the local tensor, assuming even
  /// shards (as PyTorch does) unless run_check measures them.
  TORCH_ARG(std::optional<std::vector<int64_t>>, shape) = std::nullopt;
  TORCH_ARG(std::optional<std::vector<int64_t>>, stride) = std::nullopt;
};

class DTensor {
 public:
  /// Wraps this rank's `local` tensor as its part of a DTensor with `placements` (default:
  /// Replicate on every mesh dimension). No data moves unless options.run_check().
  static DTensor from_local(const at::Tensor& local, const mesh::DeviceMesh& mesh,
                            Placements placements = {}, const FromLocalOptions& options = {});

  /// This rank's local tensor, in the autograd graph. `grad_placements` states the placements
  /// of the gradient the caller's computation will produce for it (default: this DTensor's,
  /// Partial read as Replicate); the backward moves that gradient into this DTensor's layout.
  at::Tensor to_local(const std::optional<Placements>& grad_placements = std::nullopt) const;
  /// The whole tensor on every rank (redistribute to Replicate, then to_local).
  at::Tensor full_tensor(const std::optional<Placements>& grad_placements = std::nullopt) const;
  /// The same global tensor with other placements on the same mesh. Moving to Partial is
  /// refused unless the placement already is that Partial (as in PyTorch).
  DTensor redistribute(Placements placements) const;

  const mesh::DeviceMesh& device_mesh() const { return mesh_; }
  const Placements& placements() const { return placements_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& stride() const { return stride_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const;
  at::ScalarType dtype() const { return local_.scalar_type(); }
  c10::Device device() const { return local_.device(); }
  bool requires_grad() const { return local_.requires_grad(); }
  /// "DTensor(shape=[4, 6], placements=(Shard(dim=0)), mesh=DeviceMesh(...))".
  std::string to_string() const;

 private:
  DTensor(at::Tensor local, mesh::DeviceMesh mesh, Placements placements,
          std::vector<int64_t> shape, std::vector<int64_t> stride);

  at::Tensor local_;
  mesh::DeviceMesh mesh_;
  Placements placements_;
  std::vector<int64_t> shape_;
  std::vector<int64_t> stride_;
};

/// Distributes a tensor every rank passes (only `src_data_rank`'s data counts, along each
/// mesh dimension: its shards are scattered and its replicas broadcast; std::nullopt: each
/// rank uses its own tensor and nothing is communicated). The result is a leaf that requires
/// grad as `tensor` does. Partial placements split the value (SUM: divided by the mesh
/// dimension's size; AVG, MIN, MAX: kept). The tensor moves to the mesh's device type.
DTensor distribute_tensor(const at::Tensor& tensor, const mesh::DeviceMesh& mesh,
                          Placements placements = {}, std::optional<int> src_data_rank = 0);

/// The shape of this rank's local tensor and its offset in the global tensor, for a global
/// shape laid out with `placements` (PyTorch's compute_local_shape_and_global_offset).
/// Partial and Replicate dimensions keep the whole extent.
std::pair<std::vector<int64_t>, std::vector<int64_t>> compute_local_shape_and_global_offset(
    const std::vector<int64_t>& global_shape, const mesh::DeviceMesh& mesh,
    const Placements& placements);

}  // namespace tdist::tensor

#pragma once

// What the three implementations share: resolving kDefault, refusing what a kernel cannot
// take (by parameter), and splitting a group into the (device, dtype) buckets ATen's
// multi-tensor and fused kernels need.

#include <cstddef>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/optim/implementation.h"

namespace tdist::optim::detail {

/// The parameters of one param group that have a gradient, with their positions in it.
struct SteppedParams {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> grads;
  std::vector<size_t> positions;  // index in the param group, for messages
};

/// `group`'s parameters with a defined gradient; a sparse gradient is refused, naming the
/// optimizer, the group and the parameter.
SteppedParams stepped_params(const std::vector<at::Tensor>& group, size_t group_index,
                             const char* optimizer);

/// kDefault as PyTorch resolves it (foreach when every parameter is on CUDA, else the
/// for-loop); a request the parameters cannot take is refused, naming the parameter.
Implementation resolve(Implementation requested, const SteppedParams& stepped, size_t group_index,
                       const char* optimizer);

// Note [Fused kernels and strides]
// ATen's fused optimizer kernels walk a parameter, its gradient and its state as flat memory:
// on tensors of different strides (a transposed parameter, the slice of a parameter sharded on
// another dim, with a contiguous gradient or a state loaded contiguous) they silently combine
// the wrong elements. The fused paths therefore take only dense parameters (resolve) and lay
// every other tensor out as its parameter is (laid_out_like) before the call.

/// `t` itself when it has `param`'s strides, else a copy of it that does (param dense).
at::Tensor laid_out_like(const at::Tensor& param, const at::Tensor& t);

/// Index lists of `params` with equal device and dtype, in first-seen order.
std::vector<std::vector<size_t>> by_device_and_dtype(const std::vector<at::Tensor>& params);

/// The tensors of `all` at `indices`.
std::vector<at::Tensor> pick(const std::vector<at::Tensor>& all,
                             const std::vector<size_t>& indices);

}  // namespace tdist::optim::detail

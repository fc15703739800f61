#pragma once

// clip_grad_norm_ over sharded gradients: the norm of the whole model's gradient, not of the
// local shards (pytorch#170862), as torch.nn.utils.clip_grad_norm_ on the unsharded model.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace tdist::fsdp {

/// Computes the global `norm_type` norm (2, 1, or +inf) of the gradients of every parameter
/// of `module` — sharded ones reduced over their shard group, replicated (ignored) ones
/// counted once — and scales every gradient by max_norm / (norm + 1e-6) when that is < 1.
/// Collective over the module's FSDP groups. Returns the total norm (float32 scalar on the
/// first gradient's device). Sync-free: the norm and the scale stay on the device
/// (tdist::optim::clip_grad_norm_'s multi-tensor ops); nothing waits for the device unless
/// error_if_nonfinite is set.
/// error_if_nonfinite: raise tdist::Error when the norm is nan or inf.
at::Tensor clip_grad_norm_(const torch::nn::Module& module, double max_norm, double norm_type = 2.0,
                           bool error_if_nonfinite = false);

template <class Impl>
at::Tensor clip_grad_norm_(const torch::nn::ModuleHolder<Impl>& module, double max_norm,
                           double norm_type = 2.0, bool error_if_nonfinite = false) {
  return clip_grad_norm_(*module.ptr(), max_norm, norm_type, error_if_nonfinite);
}

}  // namespace tdist::fsdp

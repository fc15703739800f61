#pragma once

// Gradient clipping without waiting for the device: torch.nn.utils' get_total_norm,
// clip_grads_with_norm_ and clip_grad_norm_ on multi-tensor ATen ops. The norm stays a
// tensor on the gradients' device and the scale is applied there
// (clamp(max_norm / (norm + 1e-6), max=1)), so nothing reads a value back to the host
// unless error_if_nonfinite asks for the check. Sharded callers (tdist::fsdp's
// clip_grad_norm_) all-reduce partial_grad_norm over their groups before the root.
//
//   at::Tensor norm = tdist::optim::clip_grad_norm_(model->parameters(), 1.0);
//   // ... norm.item<double>() later, when the value is wanted

#include <vector>

#include <ATen/core/Tensor.h>

namespace tdist::optim {

/// The reducible part of a norm of order `norm_type` over `tensors`: sum |t|^p, or max |t|
/// for p = inf, as a 0-dim float64 tensor on the first tensor's device (CPU when there is
/// none). One `_foreach_norm` per (device, dtype) bucket.
at::Tensor partial_grad_norm(const std::vector<at::Tensor>& tensors, double norm_type);

/// partial_grad_norm's root: partial^(1/p) (the partial itself for p = inf), as float32.
at::Tensor finish_grad_norm(const at::Tensor& partial, double norm_type);

/// The norm of order `norm_type` (> 0, or inf) of `tensors` taken together, as float32 on
/// their device. error_if_nonfinite: throws tdist::Error for a nan or inf norm (this reads
/// the norm on the host).
at::Tensor get_total_norm(const std::vector<at::Tensor>& tensors, double norm_type = 2.0,
                          bool error_if_nonfinite = false);

/// Scales every gradient of `params` by clamp(max_norm / (total_norm + 1e-6), max=1), on
/// the device, one `_foreach_mul_` per (device, dtype) bucket.
void clip_grads_with_norm_(const std::vector<at::Tensor>& params, double max_norm,
                           const at::Tensor& total_norm);

/// get_total_norm of the gradients of `params`, then clip_grads_with_norm_; returns the norm
/// (float32, on the gradients' device). Parameters without a gradient are skipped. For DDP
/// (gradients already equal on every rank) pass the module's parameters as they are; for
/// FSDP use tdist::fsdp::clip_grad_norm_, which reduces over the shard groups.
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                           double norm_type = 2.0, bool error_if_nonfinite = false);

/// Throws tdist::Error when `total_norm` is nan or inf (reads it on the host).
void check_finite_norm(const at::Tensor& total_norm, double norm_type);

}  // namespace tdist::optim

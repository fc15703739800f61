#include "tdist/optim/clip_grad.h"

#include <cmath>
#include <string>

#include <ATen/ATen.h>

#include "optim/tensor_buckets.h"
#include "tdist/error.h"

namespace tdist::optim {
namespace {

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) {
    if (p.grad().defined()) out.push_back(p.grad());
  }
  return out;
}

void check_order(double norm_type) {
  TDIST_CHECK_ARG(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 (or inf), got " +
                                     std::to_string(norm_type));
}

}  // namespace

at::Tensor partial_grad_norm(const std::vector<at::Tensor>& tensors, double norm_type) {
  check_order(norm_type);
  const bool inf = std::isinf(norm_type);
  at::Tensor acc;
  for (const auto& bucket : detail::by_device_and_dtype(tensors)) {
    const std::vector<at::Tensor> ts = detail::pick(tensors, bucket);
    // Each tensor's norm in float64, then their p-th powers summed: the sum of |t|^p.
    const at::Tensor norms = at::stack(at::_foreach_norm(ts, norm_type, at::kDouble));
    at::Tensor part = inf ? norms.max() : norms.pow(norm_type).sum();
    if (!acc.defined()) {
      acc = part;
      continue;
    }
    part = part.to(acc.device(), /*non_blocking=*/true);
    acc = inf ? at::maximum(acc, part) : acc + part;
  }
  return acc.defined() ? acc : at::zeros({}, at::kDouble);
}

at::Tensor finish_grad_norm(const at::Tensor& partial, double norm_type) {
  const at::Tensor root = std::isinf(norm_type) ? partial : partial.pow(1.0 / norm_type);
  return root.to(at::kFloat);
}

void check_finite_norm(const at::Tensor& total_norm, double norm_type) {
  const double norm = total_norm.item<double>();
  if (!std::isfinite(norm)) {
    TDIST_THROW(Error, "clip_grad_norm_: the total norm of order " + std::to_string(norm_type) +
                           " of the gradients is non-finite (" + std::to_string(norm) +
                           "); pass error_if_nonfinite=false to clip anyway");
  }
}

at::Tensor get_total_norm(const std::vector<at::Tensor>& tensors, double norm_type,
                          bool error_if_nonfinite) {
  const at::Tensor total = finish_grad_norm(partial_grad_norm(tensors, norm_type), norm_type);
  if (error_if_nonfinite) check_finite_norm(total, norm_type);
  return total;
}

void clip_grads_with_norm_(const std::vector<at::Tensor>& params, double max_norm,
                           const at::Tensor& total_norm) {
  const std::vector<at::Tensor> grads = grads_of(params);
  if (grads.empty()) return;
  at::NoGradGuard no_grad;
  // float32, as torch.nn.utils computes it; a bf16 gradient is scaled in float and rounded.
  const at::Tensor coef = (max_norm / (total_norm.to(at::kFloat) + 1e-6)).clamp_max(1.0);
  for (const auto& bucket : detail::by_device_and_dtype(grads)) {
    std::vector<at::Tensor> gs = detail::pick(grads, bucket);
    at::_foreach_mul_(gs, coef.to(gs.front().device(), /*non_blocking=*/true));
  }
}

at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm, double norm_type,
                           bool error_if_nonfinite) {
  const at::Tensor total = get_total_norm(grads_of(params), norm_type, error_if_nonfinite);
  clip_grads_with_norm_(params, max_norm, total);
  return total;
}

}  // namespace tdist::optim

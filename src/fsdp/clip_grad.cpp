#include "tdist/fsdp/clip_grad.h"

#include <cmath>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "fsdp/fsdp_state.h"
#include "fsdp/registry.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/optim/clip_grad.h"

namespace tdist::fsdp {

at::Tensor clip_grad_norm_(const torch::nn::Module& module, double max_norm, double norm_type,
                           bool error_if_nonfinite) {
  TDIST_CHECK_ARG(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 (or inf), got " +
                                     std::to_string(norm_type));
  const bool inf = std::isinf(norm_type);
  std::unordered_set<const c10::TensorImpl*> sharded_impls;
  std::vector<std::pair<ProcessGroupPtr, std::vector<at::Tensor>>> by_group;
  std::vector<at::Tensor> clipped;  // every parameter with a gradient
  for (detail::FSDPState* s : detail::states_under(module)) {
    detail::ParamGroup* g = s->group();
    if (g == nullptr) continue;
    std::vector<at::Tensor>* bucket = nullptr;
    for (auto& [pg, grads] : by_group) {
      if (pg == g->shard_group()) bucket = &grads;
    }
    if (bucket == nullptr) {
      by_group.emplace_back(g->shard_group(), std::vector<at::Tensor>());
      bucket = &by_group.back().second;
    }
    for (const auto& p : g->params()) {
      sharded_impls.insert(p->param().unsafeGetTensorImpl());
      const at::Tensor& grad = p->param().grad();
      if (!grad.defined()) continue;
      bucket->push_back(grad);
      clipped.push_back(p->param());
    }
  }
  // Everything else (ignored or unsharded parameters) is whole on every rank.
  std::vector<at::Tensor> replicated;
  for (const auto& p : module.parameters()) {
    if (sharded_impls.count(p.unsafeGetTensorImpl()) != 0 || !p.grad().defined()) continue;
    replicated.push_back(p.grad());
    clipped.push_back(p);
  }
  if (clipped.empty()) return at::zeros({}, at::kFloat);

  // Sync-free: the partial norms stay on their devices, the root and the scale too
  // (tdist::optim's multi-tensor helpers); only error_if_nonfinite reads the norm back.
  // Accumulated where the first gradient lives (a GPU, unless everything is offloaded).
  const at::Device device = clipped.front().grad().device();
  at::Tensor total = replicated.empty()
                         ? at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device))
                         : optim::partial_grad_norm(replicated, norm_type).to(device, true);
  for (auto& [pg, grads] : by_group) {
    at::Tensor part = optim::partial_grad_norm(grads, norm_type);
    if (pg->size() > 1) {
      at::Tensor on = to_collective_device(part, pg);  // offloaded gradients, nccl-only group
      all_reduce(on, inf ? ReduceOp::MAX : ReduceOp::SUM, pg);
      part = on.to(total.device(), /*non_blocking=*/true);
    } else {
      part = part.to(total.device(), /*non_blocking=*/true);
    }
    total = inf ? at::maximum(total, part) : total + part;
  }
  const at::Tensor norm = optim::finish_grad_norm(total, norm_type);
  if (error_if_nonfinite) optim::check_finite_norm(norm, norm_type);
  optim::clip_grads_with_norm_(clipped, max_norm, norm);
  return norm;
}

}  // namespace tdist::fsdp

#include "tdist/fsdp/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "fsdp/fsdp_state.h"
#include "fsdp/registry.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::fsdp {

namespace {

// Partial norms: sum of |g|^p (or max |g| for p = inf), per process group the gradients are
// sharded over, plus one for gradients every rank holds whole (counted once, not reduced).
struct PartialNorms {
  std::vector<std::pair<ProcessGroupPtr, at::Tensor>> sharded;  // in first-seen order
  at::Tensor replicated;
};

// Each device's gradients are reduced where they are, and each device's partial comes to the
// host once: a .cpu() per gradient would make the host wait for the GPU at every parameter.
// The sums run in the gradients' order per device, in double, as the host's did.
at::Tensor local_partial(const std::vector<at::Tensor>& grads, double p) {
  const bool inf = std::isinf(p);
  std::vector<std::pair<c10::Device, at::Tensor>> per_device;
  for (const auto& g : grads) {
    if (g.numel() == 0) continue;  // adds nothing to a sum or a max
    const at::Tensor gd = g.detach().to(at::kDouble);
    const at::Tensor part = inf ? gd.abs().max() : gd.abs().pow(p).sum();
    auto it = std::find_if(per_device.begin(), per_device.end(),
                           [&](const auto& entry) { return entry.first == g.device(); });
    if (it == per_device.end()) {
      per_device.emplace_back(g.device(), part);
    } else {
      it->second = inf ? at::maximum(it->second, part) : it->second + part;
    }
  }
  at::Tensor acc = at::zeros({}, at::kDouble);
  for (const auto& entry : per_device) {
    const at::Tensor on_host = entry.second.cpu();
    acc = inf ? at::maximum(acc, on_host) : acc + on_host;
  }
  return acc;
}

}  // namespace

at::Tensor clip_grad_norm_(const torch::nn::Module& module, double max_norm, double norm_type,
                           bool error_if_nonfinite) {
  TDIST_CHECK_ARG(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 (or inf), got " +
                                     std::to_string(norm_type));
  const bool inf = std::isinf(norm_type);
  std::unordered_set<const c10::TensorImpl*> sharded_impls;
  std::vector<std::pair<ProcessGroupPtr, std::vector<at::Tensor>>> by_group;
  std::vector<at::Tensor> all_grads;
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
      all_grads.push_back(grad);
    }
  }
  // Everything else (ignored or unsharded parameters) is whole on every rank.
  std::vector<at::Tensor> replicated;
  for (const auto& p : module.parameters()) {
    if (sharded_impls.count(p.unsafeGetTensorImpl()) != 0 || !p.grad().defined()) continue;
    replicated.push_back(p.grad());
    all_grads.push_back(p.grad());
  }

  at::Tensor total = local_partial(replicated, norm_type);
  for (auto& [pg, grads] : by_group) {
    at::Tensor part = local_partial(grads, norm_type);
    if (pg->size() > 1) {
      at::Tensor on = to_collective_device(part, pg);  // offloaded gradients, nccl-only group
      all_reduce(on, inf ? ReduceOp::MAX : ReduceOp::SUM, pg);
      part = on.to(part.device());
    }
    total = inf ? at::maximum(total, part) : total + part;
  }
  if (!inf) total = total.pow(1.0 / norm_type);
  const double norm = total.item<double>();
  if (error_if_nonfinite && !std::isfinite(norm)) {
    TDIST_THROW(Error, "clip_grad_norm_: the total norm of order " + std::to_string(norm_type) +
                           " of the gradients is non-finite (" + std::to_string(norm) +
                           "); pass error_if_nonfinite=false to clip anyway");
  }
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    at::NoGradGuard no_grad;
    for (auto& g : all_grads) g.mul_(coef);
  }
  return total.to(at::kFloat);
}

}  // namespace tdist::fsdp

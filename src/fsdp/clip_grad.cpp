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
#include "tdist/tensor/parallel/parallelize.h"

namespace tdist::fsdp {

namespace {

// The tensor-parallel group over which a parameter's local gradient is one shard of its
// whole gradient (its norm then sums over those ranks too), or null: not distributed by
// tensor parallelism, or replicated there (counted once).
ProcessGroupPtr tensor_parallel_shard_group(const at::Tensor& param) {
  const auto placement = tensor::parallel::parameter_placement(param);
  if (!placement) return nullptr;
  for (const auto& p : placement->placements) {
    if (tensor::is_shard(p)) return placement->mesh.get_group(0);
  }
  return nullptr;
}

// Gradients whose partial norms are reduced over the same groups: FSDP's shard group (null
// for what FSDP does not shard), then the tensor-parallel group (null where replicated).
struct NormBucket {
  ProcessGroupPtr shard_group;
  ProcessGroupPtr tensor_parallel_group;
  std::vector<at::Tensor> grads;
};

std::vector<at::Tensor>& bucket_for(std::vector<NormBucket>& buckets, const ProcessGroupPtr& shard,
                                    const ProcessGroupPtr& tp) {
  for (auto& b : buckets) {
    if (b.shard_group == shard && b.tensor_parallel_group == tp) return b.grads;
  }
  buckets.push_back(NormBucket{shard, tp, {}});
  return buckets.back().grads;
}

at::Tensor reduced_over(at::Tensor part, const ProcessGroupPtr& group, bool inf) {
  if (group == nullptr || group->size() == 1) return part;
  at::Tensor on = to_collective_device(part, group);  // offloaded gradients, nccl-only group
  all_reduce(on, inf ? ReduceOp::MAX : ReduceOp::SUM, group);
  return on.to(part.device(), /*non_blocking=*/true);
}

}  // namespace

at::Tensor clip_grad_norm_(const torch::nn::Module& module, double max_norm, double norm_type,
                           bool error_if_nonfinite) {
  TDIST_CHECK_ARG(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 (or inf), got " +
                                     std::to_string(norm_type));
  const bool inf = std::isinf(norm_type);
  std::unordered_set<const c10::TensorImpl*> sharded_impls;
  std::vector<NormBucket> buckets;
  std::vector<at::Tensor> clipped;  // every parameter with a gradient
  for (detail::FSDPState* s : detail::states_under(module)) {
    detail::ParamGroup* g = s->group();
    if (g == nullptr) continue;
    for (const auto& p : g->params()) {
      sharded_impls.insert(p->param().unsafeGetTensorImpl());
      const at::Tensor& grad = p->param().grad();
      if (!grad.defined()) continue;
      bucket_for(buckets, g->shard_group(), tensor_parallel_shard_group(p->param()))
          .push_back(grad);
      clipped.push_back(p->param());
    }
  }
  // Everything else (ignored or unsharded parameters) is whole on every rank of FSDP's group.
  for (const auto& p : module.parameters()) {
    if (sharded_impls.count(p.unsafeGetTensorImpl()) != 0 || !p.grad().defined()) continue;
    bucket_for(buckets, nullptr, tensor_parallel_shard_group(p)).push_back(p.grad());
    clipped.push_back(p);
  }
  if (clipped.empty()) return at::zeros({}, at::kFloat);

  // Sync-free: the partial norms stay on their devices, the root and the scale too
  // (tdist::optim's multi-tensor helpers); only error_if_nonfinite reads the norm back.
  // Accumulated where the first gradient lives (a GPU, unless everything is offloaded).
  const at::Device device = clipped.front().grad().device();
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const auto& b : buckets) {
    at::Tensor part = optim::partial_grad_norm(b.grads, norm_type);
    part = reduced_over(reduced_over(part, b.shard_group, inf), b.tensor_parallel_group, inf);
    part = part.to(total.device(), /*non_blocking=*/true);
    total = inf ? at::maximum(total, part) : total + part;
  }
  const at::Tensor norm = optim::finish_grad_norm(total, norm_type);
  if (error_if_nonfinite) optim::check_finite_norm(norm, norm_type);
  optim::clip_grads_with_norm_(clipped, max_norm, norm);
  return norm;
}

}  // namespace tdist::fsdp

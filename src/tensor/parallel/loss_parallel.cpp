#include <ATen/ATen.h>

#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/tensor/parallel/parallelize.h"

namespace tdist::tensor::parallel {
namespace {

void check_arguments(const DTensor& logits, const at::Tensor& target,
                     const LossParallelOptions& options) {
  const std::string what = "loss_parallel_cross_entropy: ";
  TDIST_CHECK_ARG(logits.device_mesh().ndim() == 1,
                  what + "the logits lie on a " + std::to_string(logits.device_mesh().ndim()) +
                      "-D mesh; pass them on the tensor-parallel dimension alone");
  TDIST_CHECK_ARG(logits.dim() == 2, what + "logits of shape " +
                                         c10::str(c10::IntArrayRef(logits.shape())) +
                                         "; give them as [N, classes] (flatten the batch and "
                                         "sequence dims first)");
  TDIST_CHECK_ARG(logits.placements() == Placements{Shard(1)},
                  what + "logits placed " + to_string(logits.placements()) +
                      "; loss parallelism needs them sharded along the classes, (Shard(dim=1))");
  TDIST_CHECK_ARG(target.dim() == 1 && target.size(0) == logits.shape()[0],
                  what + "target of shape " + c10::str(target.sizes()) + " for " +
                      std::to_string(logits.shape()[0]) + " rows of logits");
  TDIST_CHECK_ARG(!at::isFloatingType(target.scalar_type()),
                  what + "target holds class indices, not " + c10::toString(target.scalar_type()));
  TDIST_CHECK_ARG(options.reduction() == "mean" || options.reduction() == "sum" ||
                      options.reduction() == "none",
                  what + "reduction '" + options.reduction() + "'; use mean, sum or none");
  const int64_t classes = logits.shape()[1];
  const at::Tensor valid = target != options.ignore_index();
  const at::Tensor bad = valid.logical_and(target.lt(0).logical_or(target.ge(classes)));
  TDIST_CHECK_ARG(!bad.any().item<bool>(),
                  what + "a target is outside [0, " + std::to_string(classes) +
                      ") and is not ignore_index " + std::to_string(options.ignore_index()));
}

// A per-row value each rank computed from its classes alone, summed over the ranks; the
// backward gives every rank the whole gradient (Partial -> Replicate, Note [DTensor autograd]).
at::Tensor summed_over_shards(const at::Tensor& partial, const mesh::DeviceMesh& mesh) {
  return DTensor::from_local(partial, mesh, {Partial()}).full_tensor();
}

}  // namespace

at::Tensor loss_parallel_cross_entropy(const DTensor& logits, const at::Tensor& target,
                                       const LossParallelOptions& options) {
  check_arguments(logits, target, options);
  const mesh::DeviceMesh& mesh = logits.device_mesh();
  const at::Tensor local = logits.to_local();
  const auto [classes, first] =
      local_shard_size_and_offset(logits.shape()[1], mesh.size(0), mesh.get_local_rank(0));
  const at::Tensor labels = target.to(local.device());
  // The largest logit of each row: a shift that keeps exp() finite and changes no gradient.
  at::Tensor row_max = classes > 0 ? local.detach().amax(1, /*keepdim=*/true)
                                   : at::full({local.size(0), 1}, -INFINITY, local.options());
  all_reduce(row_max, ReduceOp::MAX, mesh.get_group(0));
  const at::Tensor shifted = local - row_max;
  const at::Tensor log_sum_exp = summed_over_shards(shifted.exp().sum(1), mesh).log();
  const at::Tensor outside = labels.lt(first).logical_or(labels.ge(first + classes));
  at::Tensor picked = at::zeros({local.size(0)}, local.options());
  if (classes > 0) {
    const at::Tensor column = (labels - first).masked_fill(outside, 0).unsqueeze(1);
    picked = shifted.gather(1, column).squeeze(1).masked_fill(outside, 0);
  }
  const at::Tensor ignored = labels.eq(options.ignore_index());
  const at::Tensor loss = (log_sum_exp - summed_over_shards(picked, mesh)).masked_fill(ignored, 0);
  if (options.reduction() == "none") return loss;
  if (options.reduction() == "sum") return loss.sum();
  return loss.sum() / ignored.logical_not().sum();
}

}  // namespace tdist::tensor::parallel

#pragma once

// parallelize_module and the forward call that runs a parallelized module
// (torch.distributed.tensor.parallel.parallelize_module, in LibTorch). LibTorch modules have
// no forward hooks, so a parallelized submodule is called through
// tdist::tensor::parallel::forward, as FSDP's are through tdist::fsdp::forward:
//   `q = q_proj(x)` becomes `q = tdist::tensor::parallel::forward(q_proj, x)`.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "tdist/mesh/device_mesh.h"
#include "tdist/tensor/dtensor.h"
#include "tdist/tensor/parallel/style.h"

namespace tdist::tensor::parallel {

/// Applies each style of `plan` to the submodules its key matches (every key must match at
/// least one). `mesh` is 1-D (the "tp" dimension of a larger mesh: mesh["tp"]). Parameters
/// are distributed from the mesh's first rank, so every rank starts from the same model.
/// Every rank calls it with the same plan.
void parallelize_module(const std::shared_ptr<torch::nn::Module>& module,
                        const mesh::DeviceMesh& mesh, const ParallelizePlan& plan);
/// Applies one style to `module` itself.
void parallelize_module(const std::shared_ptr<torch::nn::Module>& module,
                        const mesh::DeviceMesh& mesh, const StyleRef& style);

/// A parameter of a parallelized module (its local shard is the module's parameter) as the
/// DTensor it is part of: name as in named_parameters(), e.g. "weight".
DTensor parameter_dtensor(const torch::nn::Module& module, const std::string& name);

/// Where a parameter that parallelize_module distributed lies: the tensor-parallel mesh, its
/// placements there and its global shape. FSDP's gradient clipping reads it to sum a
/// sharded parameter's norm over the tensor-parallel ranks too (and a replicated one's not).
struct ParameterPlacement {
  mesh::DeviceMesh mesh;
  Placements placements;
  std::vector<int64_t> global_shape;
};
/// The placement of `param` (the module's parameter object itself, whatever FSDP later did
/// to its data), or nullopt when no style distributed it.
std::optional<ParameterPlacement> parameter_placement(const at::Tensor& param);

/// The style applied to `module`, or nullptr.
std::shared_ptr<const ParallelStyle> style_of(const torch::nn::Module& module);

namespace detail {
class TPState;
TPState& state_of(const torch::nn::Module& module, const char* caller);
at::Tensor prepare_input(const TPState& state, const at::Tensor& input);
/// Column- and row-parallel Linear and Embedding compute their forward themselves.
bool computes_itself(const TPState& state);
DTensor compute(const TPState& state, torch::nn::Module& module, const at::Tensor& input);
DTensor prepare_output(const TPState& state, const at::Tensor& output);
void check_local_output(const TPState& state);

/// While a PrepareModuleInput(use_local_output(false)) module's forward runs: its prepared
/// input, whose gradient is reduced once where it was prepared (see PrepareModuleInput).
class ReducedOnceScope {
 public:
  ReducedOnceScope(const TPState& state, const at::Tensor& prepared);
  ~ReducedOnceScope();
  ReducedOnceScope(const ReducedOnceScope&) = delete;
  ReducedOnceScope& operator=(const ReducedOnceScope&) = delete;

 private:
  bool active_;
};
}  // namespace detail

/// Runs a parallelized module: its style moves the first input (a local tensor in the
/// style's input_layouts) to the layout the computation needs, runs it, and returns the
/// output laid out as output_layouts (Note [Local tensors between modules]).
template <class Holder, class... Rest>
DTensor forward_dtensor(Holder& module, const at::Tensor& input, Rest&&... rest) {
  const detail::TPState& state = detail::state_of(*module, "forward_dtensor");
  const at::Tensor x = detail::prepare_input(state, input);
  if (detail::computes_itself(state)) return detail::compute(state, *module, x);
  const detail::ReducedOnceScope reduced_once(state, x);
  return detail::prepare_output(state, module->forward(x, std::forward<Rest>(rest)...));
}

/// forward_dtensor's local tensor; refused for a style with use_local_output(false).
template <class Holder, class... Rest>
at::Tensor forward(Holder& module, const at::Tensor& input, Rest&&... rest) {
  detail::check_local_output(detail::state_of(*module, "forward"));
  return forward_dtensor(module, input, std::forward<Rest>(rest)...).to_local();
}

struct LossParallelOptions {
  TORCH_ARG(int64_t, ignore_index) = -100;
  /// "mean" (over the targets not ignored), "sum" or "none".
  TORCH_ARG(std::string, reduction) = "mean";
};

/// loss_parallel: cross-entropy of logits [N, C] sharded along the classes (Shard(1) on a
/// 1-D mesh) against targets [N] (every rank the same), without gathering the logits: a
/// max and a sum of exponentials all-reduced across the shards, and each target's logit
/// taken from the rank that holds it. The same loss on every rank; each rank's logits get
/// their shard of the gradient.
at::Tensor loss_parallel_cross_entropy(const DTensor& logits, const at::Tensor& target,
                                       const LossParallelOptions& options = {});

}  // namespace tdist::tensor::parallel

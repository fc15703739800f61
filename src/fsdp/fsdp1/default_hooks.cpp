// FSDP1's default communication hooks: torch/distributed/algorithms/_comm_hooks/
// default_hooks.py, in place (see comm_hooks.h).

#include <string>

#include <ATen/ATen.h>

#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/fsdp/comm_hooks.h"

namespace tdist::fsdp::default_hooks {

namespace {

// The largest power of two that divides the world size and stays at most its square root
// (PyTorch's _get_gradient_predivide_factor): 4 ranks -> 2, 8 -> 4, 3 -> 1.
double predivide_factor(int world_size) {
  int factor = 1;
  while (world_size % factor == 0 && world_size / factor > factor) factor *= 2;
  return static_cast<double>(factor);
}

void low_precision_hook(c10::ScalarType precision, LowPrecisionState& state, const at::Tensor& grad,
                        const at::Tensor& output) {
  const at::Tensor low_grad = grad.scalar_type() == precision ? grad : grad.to(precision);
  if (output.defined()) {
    const at::Tensor low_output =
        output.scalar_type() == precision ? output : at::empty_like(output, precision);
    reduce_scatter_hook(state, low_grad, low_output);
    if (!low_output.is_same(output)) output.copy_(low_output);  // decompress
  } else {
    allreduce_hook(state, low_grad);
    if (!low_grad.is_same(grad)) grad.copy_(low_grad);
  }
}

}  // namespace

DefaultState::DefaultState(ProcessGroupPtr group) : process_group(std::move(group)) {
  TDIST_CHECK_ARG(process_group != nullptr,
                  "default_hooks::DefaultState: the process group is null; pass the group the "
                  "FSDP model shards over, e.g. tdist::group_world()");
  world_size = process_group->size();
  gradient_predivide_factor = predivide_factor(world_size);
  gradient_postdivide_factor = world_size / gradient_predivide_factor;
}

LowPrecisionState::LowPrecisionState(ProcessGroupPtr group, c10::ScalarType type)
    : DefaultState(std::move(group)), parameter_type(type) {}

void allreduce_hook(DefaultState& state, const at::Tensor& grad) {
  if (state.gradient_predivide_factor > 1) grad.div_(state.gradient_predivide_factor);
  all_reduce(grad, ReduceOp::SUM, state.process_group);
  if (state.gradient_postdivide_factor > 1) grad.div_(state.gradient_postdivide_factor);
}

void reduce_scatter_hook(DefaultState& state, const at::Tensor& grad, const at::Tensor& output) {
  TDIST_CHECK_ARG(output.defined(),
                  "default_hooks::reduce_scatter_hook: no output to reduce-scatter into "
                  "(NO_SHARD passes none); register allreduce_hook for NO_SHARD");
  if (state.gradient_predivide_factor > 1) grad.div_(state.gradient_predivide_factor);
  reduce_scatter_tensor(output, grad, ReduceOp::SUM, state.process_group);
  if (state.gradient_postdivide_factor > 1) output.div_(state.gradient_postdivide_factor);
}

void fp16_compress_hook(LowPrecisionState& state, const at::Tensor& grad,
                        const at::Tensor& output) {
  low_precision_hook(at::kHalf, state, grad, output);
}

void bf16_compress_hook(LowPrecisionState& state, const at::Tensor& grad,
                        const at::Tensor& output) {
  low_precision_hook(at::kBFloat16, state, grad, output);
}

}  // namespace tdist::fsdp::default_hooks

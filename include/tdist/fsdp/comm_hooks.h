#pragma once

// FSDP1's default communication hooks (torch.distributed.algorithms._comm_hooks.default_hooks),
// for FullyShardedDataParallel::register_comm_hook:
//
//   fsdp.register_comm_hook(std::make_shared<default_hooks::DefaultState>(group_world()),
//                           default_hooks::reduce_scatter_hook);   // FULL_SHARD, SHARD_GRAD_OP
//   fsdp.register_comm_hook(std::make_shared<default_hooks::LowPrecisionState>(group_world()),
//                           default_hooks::bf16_compress_hook);    // any non-hybrid strategy
//
// Each reduces in place (as FSDP's core needs): the result is written into `output` (sharded
// strategies) or `grad` (NO_SHARD), in their own dtype.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "tdist/comm/process_group.h"

namespace tdist::fsdp::default_hooks {

/// PyTorch's DefaultState: the group to reduce over and the two factors that average the
/// gradients over its ranks in two steps, before and after the collective, so that low
/// precision neither overflows nor underflows (their product is the group size).
struct DefaultState {
  /// `process_group` must be given (InvalidArgument otherwise, as PyTorch's ValueError).
  explicit DefaultState(ProcessGroupPtr process_group);
  virtual ~DefaultState() = default;

  ProcessGroupPtr process_group;
  int world_size;
  double gradient_predivide_factor;
  double gradient_postdivide_factor;
};

/// PyTorch's LowPrecisionState. parameter_type is kept for PyTorch's signature: here the
/// decompressed result always takes the gradient buffer's dtype (the parameters', or the
/// mixed-precision reduce dtype), which the hook may not change.
struct LowPrecisionState : DefaultState {
  explicit LowPrecisionState(ProcessGroupPtr process_group,
                             c10::ScalarType parameter_type = c10::ScalarType::Float);

  c10::ScalarType parameter_type;
};

/// NO_SHARD: divides `grad` by the pre-divide factor, all-reduces it (SUM) over the group and
/// divides by the post-divide factor, in place.
void allreduce_hook(DefaultState& state, const at::Tensor& grad);

/// Sharded strategies: pre-divides `grad`, reduce-scatters it (SUM) into `output` and
/// post-divides `output`. InvalidArgument when `output` is undefined (NO_SHARD: use
/// allreduce_hook).
void reduce_scatter_hook(DefaultState& state, const at::Tensor& grad, const at::Tensor& output);

/// Reduces in float16: `grad` (and `output`) cast down, reduced as reduce_scatter_hook (with
/// `output`) or allreduce_hook (without), and the result cast back into `output` / `grad`.
void fp16_compress_hook(LowPrecisionState& state, const at::Tensor& grad,
                        const at::Tensor& output = {});

/// fp16_compress_hook in bfloat16 (float32's range, less precision).
void bf16_compress_hook(LowPrecisionState& state, const at::Tensor& grad,
                        const at::Tensor& output = {});

}  // namespace tdist::fsdp::default_hooks

#pragma once

// Which of PyTorch's three optimizer implementations a tdist::optim optimizer runs.

#include <string>

namespace tdist::optim {

/// PyTorch's `foreach` / `fused` flags as one choice.
///   kForLoop  one parameter at a time, a handful of ATen ops each (LibTorch's torch::optim).
///   kForeach  ATen's multi-tensor `_foreach_*` ops: a few ops per (device, dtype) group.
///   kFused    ATen's fused kernels (`_fused_adamw_`, `_fused_adam_`, `_fused_sgd_`): one
///             kernel per (device, dtype) group; floating-point parameters on CPU or CUDA.
///   kDefault  as PyTorch chooses when neither flag is given: kForeach when every parameter
///             of the param group is a CUDA tensor, else kForLoop.
enum class Implementation { kDefault, kForLoop, kForeach, kFused };

/// "default", "for-loop", "foreach" or "fused".
std::string to_string(Implementation implementation);

/// The inverse of to_string; throws InvalidArgument naming the accepted spellings.
Implementation implementation_from_string(const std::string& name);

}  // namespace tdist::optim

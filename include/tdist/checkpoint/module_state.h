#pragma once

// Adapters between a plain (unsharded) torch::nn::Module + torch::optim::Optimizer and the
// ShardedStateDict that save/load exchange. Every rank holds every tensor whole; save()
// writes each one once (owners round-robin), so ranks write in parallel.
//
// Names: "model.<fqn>" for parameters and buffers (fqn as named_parameters() gives it, the
// same as PyTorch's state_dict keys), "optim.state.<fqn>.<key>" for optimizer state
// (exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer, sum, square_avg, grad_avg, step).
// Keying optimizer state by parameter name, not index, keeps it valid when the optimizer's
// parameter order or the sharding changes. FSDP/DDP adapters produce the same names.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "tdist/checkpoint/checkpoint.h"

namespace tdist::checkpoint {

constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimPrefix = "optim.state.";

/// Parameters and buffers, whole, aliasing the module's storage (loading writes in place).
ShardedStateDict module_state_dict(const torch::nn::Module& module,
                                   const std::string& prefix = kModelPrefix);

/// Saves module (+ optimizer when not null) + extra state. Collective, see save().
void save_module(const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                 const ExtraState& extra, const std::string& dir, const SaveOptions& options = {});

/// Loads what save_module wrote (at any world size) into module (+ optimizer). Optimizer
/// state missing in the optimizer (no step taken yet) is created. Collective, see load().
LoadResult load_module(torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                       const std::string& dir, const LoadOptions& options = {});

namespace detail {
/// The optimizer state of module's parameters as whole tensors. Scalars (step) are copied
/// into 0-dim int64 tensors; apply_scalars() writes loaded values back.
struct OptimizerStateView {
  ShardedStateDict tensors;
  std::vector<std::function<void()>> apply_scalars;
};
/// With `create`, absent per-parameter state is created (zeros) for the keys in `wanted`.
OptimizerStateView optimizer_state_view(torch::optim::Optimizer& optimizer,
                                        const torch::nn::Module& module, bool create,
                                        const std::map<std::string, TensorInfo>* wanted);
}  // namespace detail

}  // namespace tdist::checkpoint

#pragma once

// Adapters between a torch::nn::Module + torch::optim::Optimizer and the ShardedStateDict
// that save/load exchange, for plain, DDP and FSDP (fully_shard) modules alike; they use
// tdist::fsdp's sharded state dicts (tdist/fsdp/state_dict.h). A plain or DDP module holds
// every tensor whole on every rank and save() writes each one once (owners round-robin), so
// ranks write in parallel; an FSDP module contributes each rank's dim-0 shards. A checkpoint
// saved from any of them at world size N loads into any of them at world size M.
//
// Names: "model.<fqn>" for parameters and buffers (fqn as named_parameters() gives it, the
// same as PyTorch's state_dict keys), "optim.state.<fqn>.<key>" for optimizer state
// (exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer, sum, square_avg, grad_avg, step).
// Keying optimizer state by parameter name, not index, keeps it valid when the optimizer's
// parameter order or the sharding changes. FSDP/DDP adapters produce the same names.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "tdist/checkpoint/checkpoint.h"

namespace tdist::ddp::detail {
class DistributedDataParallelBase;
}  // namespace tdist::ddp::detail

namespace tdist::checkpoint {

constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimPrefix = "optim.state.";

/// Parameters and buffers, aliasing the module's storage (loading writes in place): whole,
/// or this rank's shards of an FSDP module's parameters.
ShardedStateDict module_state_dict(const torch::nn::Module& module,
                                   const std::string& prefix = kModelPrefix);

/// The optimizer's per-parameter state as save_module writes it ("optim.state.<fqn>.<key>"),
/// sliced like the parameters. Tensors alias the optimizer's state; `step` values are copies.
/// With module_state_dict, what to hand a CheckpointManager for a custom save.
ShardedStateDict optimizer_state_dict(const torch::nn::Module& module,
                                      torch::optim::Optimizer& optimizer,
                                      const std::string& prefix = kOptimPrefix);

/// Saves module (+ optimizer when not null) + extra state. Collective, see save().
void save_module(const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                 const ExtraState& extra, const std::string& dir, const SaveOptions& options = {});

/// Loads what save_module wrote (at any world size) into module (+ optimizer). Optimizer
/// state missing in the optimizer (no step taken yet) is created. Collective, see load().
LoadResult load_module(torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                       const std::string& dir, const LoadOptions& options = {});

/// DDP: the wrapped module's state (the same names as the plain module's).
void save_module(const ddp::detail::DistributedDataParallelBase& ddp,
                 torch::optim::Optimizer* optimizer, const ExtraState& extra,
                 const std::string& dir, const SaveOptions& options = {});
LoadResult load_module(ddp::detail::DistributedDataParallelBase& ddp,
                       torch::optim::Optimizer* optimizer, const std::string& dir,
                       const LoadOptions& options = {});

class CheckpointManager;

/// save_module through a CheckpointManager: into manager.path_for(step), then retention.
std::string save_module(CheckpointManager& manager, int64_t step, const torch::nn::Module& module,
                        torch::optim::Optimizer* optimizer, const ExtraState& extra);
/// CheckpointManager::load_latest with load_module: the newest checkpoint under the manager's
/// root that loads into module (+ optimizer); nullopt when none (a fresh start).
std::optional<LoadResult> load_latest_module(CheckpointManager& manager, torch::nn::Module& module,
                                             torch::optim::Optimizer* optimizer,
                                             const LoadOptions& options = {});

namespace detail {
/// The optimizer state of a plain module's parameters as whole tensors. Scalars (step) are copied
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

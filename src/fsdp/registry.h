#pragma once

// Module -> FSDPState, for every module fully_shard was applied to.

#include <memory>
#include <vector>

#include <torch/nn/module.h>

namespace tdist::fsdp::detail {

class FSDPState;

/// The state of `module`, or nullptr.
FSDPState* find_state(const torch::nn::Module& module);
std::shared_ptr<FSDPState> find_state_ptr(const torch::nn::Module& module);
/// Registers a new state; throws if the module already has one.
void register_state(const torch::nn::Module& module, std::shared_ptr<FSDPState> state);
/// The states of `module` and of every fully_shard'ed module below it, in module order (the
/// same on every rank, so collectives issued in this order match).
std::vector<FSDPState*> states_under(const torch::nn::Module& module);

}  // namespace tdist::fsdp::detail

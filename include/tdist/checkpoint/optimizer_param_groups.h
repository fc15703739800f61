#pragma once

// An optimizer's param groups (lr, betas, weight decay and every other per-group option) as
// PyTorch's torch.distributed.checkpoint.state_dict lays them out: a list with one object per
// group, its options under Python's names and "params", the names (FQNs) of its parameters.
//
//   [{"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-08, "weight_decay": 0.01,
//     "amsgrad": false, "maximize": false, "foreach": null, "fused": null, ...,
//     "params": ["fc1.weight", "fc1.bias"]}]
//
// Covers tdist::optim's Adam, AdamW and SGD (maximize; the implementation as Python's
// foreach / fused flags) and LibTorch's Adam, AdamW, SGD, Adagrad and RMSprop. Python-only
// flags tdist does not have (capturable, differentiable, decoupled_weight_decay) are written
// with the values that describe tdist's behaviour, so Python's load_state_dict accepts them.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

namespace tdist::checkpoint {

/// The param groups of `optimizer`, parameters named as `module` names them.
nlohmann::json optimizer_param_groups(const torch::nn::Module& module,
                                      const torch::optim::Optimizer& optimizer);

/// Sets every group's options from `groups` (as optimizer_param_groups returns them, or as
/// Python saved them), matched by position. Throws InvalidArgument when the number of groups
/// differs (naming both counts), when a group names other parameters than the optimizer's
/// group of that position, or when a value has the wrong type; keys the optimizer has no
/// option for (Python's capturable, initial_lr, ...) are ignored.
void set_optimizer_param_groups(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                const nlohmann::json& groups);

}  // namespace tdist::checkpoint

#pragma once

// Model and optimizer state dicts of FSDP models, as torch.distributed.checkpoint.state_dict
// (get_model_state_dict / set_model_state_dict / get_optimizer_state_dict /
// set_optimizer_state_dict).
//
// Keys are the parameters' and buffers' names as the unsharded module's named_parameters()
// / named_buffers() give them ("blocks.0.attn.qkv.weight"); optimizer state is keyed
// "<param fqn>.<state name>" (exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer, sum,
// square_avg, step), by name and not by index, so it survives a change of sharding.
//
//  full_state_dict = false : sharded. Each rank returns its own slices (ShardedTensor with
//                            global shape and offset); what tdist::checkpoint saves/loads.
//  full_state_dict = true  : every tensor whole (gathered). With cpu_offload, on CPU and, as
//                            PyTorch's, returned on rank 0 only (the others get empty dicts);
//                            set with broadcast_from_rank0 reads rank 0's and broadcasts it.
// Works for plain and DDP modules too (their tensors are whole already).
//
// Which tensors are sharded: every parameter a fully_shard call under `module` manages is
// dim-0 sharded (Note [Dim-0 padding] in shard_layout.h), and so is its optimizer state;
// buffers, ignored parameters and the `step` counters are whole on every rank. In a sharded
// state dict the slice of a 0-dim parameter is present only on the rank owning its element.
// Mixed precision does not show: the state dicts hold the sharded (master) dtype.
// Pass the module fully_shard was applied to last (the root) or one above it: parameters
// sharded by a fully_shard call on an ancestor of `module` are not recognised.
// The state dicts are taken between steps (not during forward/backward, not inside
// summon_full_params). A sharded state dict aliases the live parameters and optimizer state
// (clone it to keep a snapshot); a full one is always a copy.

#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "tdist/arg.h"
#include "tdist/detail/util/sharded_tensor.h"

namespace tdist::fsdp {

/// torch.distributed.checkpoint.state_dict's StateDictOptions. Not provided:
/// keep_submodule_prefixes (it only applies to the deprecated `submodules` argument) and
/// flatten_optimizer_state_dict (tdist's optimizer state dicts are always flat, keyed
/// "<fqn>.<state name>").
struct StateDictOptions {
  /// Every tensor whole (gathered, a copy) instead of this rank's slices.
  TDIST_ARG(bool, full_state_dict) = false;
  /// Tensors on the CPU. With full_state_dict, get returns entries on global rank 0 only (the
  /// others get empty dicts), as PyTorch does to keep one host copy per job.
  TDIST_ARG(bool, cpu_offload) = false;
  /// get: parameters with requires_grad = false are left out of the model state dict. Loading
  /// such a dict needs strict(false), as in PyTorch (they are reported as missing keys).
  TDIST_ARG(bool, ignore_frozen_params) = false;
  /// set_model_state_dict: every parameter and buffer of the module must be present and every
  /// key must name one (InvalidArgument naming the missing / unexpected keys otherwise).
  /// set_optimizer_state_dict: every key must name a state field of a parameter the
  /// optimizer holds (parameters without saved state are fine: no step taken yet).
  TDIST_ARG(bool, strict) = true;
  /// set, with full_state_dict only: rank 0's state dict is read and broadcast to every rank;
  /// what the other ranks pass is ignored (usually an empty dict, as get with cpu_offload
  /// gives them).
  TDIST_ARG(bool, broadcast_from_rank0) = false;
};

/// set_model_state_dict's and set_state_dict's report (PyTorch's _IncompatibleKeys): keys of
/// the module missing from the state dict and keys of the state dict the module does not
/// have. Both empty after a strict load (a strict load with either raises instead).
struct IncompatibleKeys {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

/// get_state_dict's result: `auto [model_sd, optim_sd] = get_state_dict(*model, opt);`.
struct StateDicts {
  ShardedStateDict model;
  ShardedStateDict optim;
};

/// Collective for full state dicts (all-gathers); local for sharded ones.
ShardedStateDict get_model_state_dict(const torch::nn::Module& module,
                                      const StateDictOptions& options = {});
/// Writes the state dict into the module's (sharded) parameters and buffers in place. A
/// sharded state dict must have this rank's slices; to reshard, use tdist::checkpoint.
IncompatibleKeys set_model_state_dict(torch::nn::Module& module, const ShardedStateDict& state,
                                      const StateDictOptions& options = {});

/// The optimizer's per-parameter state, keyed by parameter name. Parameters without state
/// yet (no step taken) are absent. Supports torch::optim SGD, Adam, AdamW, Adagrad, RMSprop.
ShardedStateDict get_optimizer_state_dict(const torch::nn::Module& module,
                                          torch::optim::Optimizer& optimizer,
                                          const StateDictOptions& options = {});
/// Restores optimizer state (creating per-parameter state where absent).
void set_optimizer_state_dict(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                              const ShardedStateDict& state, const StateDictOptions& options = {});

/// PyTorch's get_state_dict: the model's state dict and, merged into one, the state dicts of
/// `optimizers` (each parameter held by one of them; InvalidArgument when two hold the same).
/// Collective for full state dicts.
StateDicts get_state_dict(const torch::nn::Module& module,
                          const std::vector<torch::optim::Optimizer*>& optimizers,
                          const StateDictOptions& options = {});
StateDicts get_state_dict(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                          const StateDictOptions& options = {});
/// PyTorch's set_state_dict: loads the optimizers' state (each takes the keys of the
/// parameters it holds; with strict, a key no optimizer's parameter matches is an error),
/// then the model's. With broadcast_from_rank0 both dicts are read on rank 0 only.
IncompatibleKeys set_state_dict(torch::nn::Module& module,
                                const std::vector<torch::optim::Optimizer*>& optimizers,
                                const ShardedStateDict& model_state_dict,
                                const ShardedStateDict& optim_state_dict,
                                const StateDictOptions& options = {});
IncompatibleKeys set_state_dict(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                const ShardedStateDict& model_state_dict,
                                const ShardedStateDict& optim_state_dict,
                                const StateDictOptions& options = {});

namespace detail {

/// Reshards every FSDP group under `module` so that writes into the tensors of its sharded
/// state dict take effect (a root left unsharded by a forward-only call would keep using its
/// stale unsharded data). Throws InvalidArgument during forward/backward or inside
/// summon_full_params. set_*_state_dict call it; so does tdist::checkpoint's load_module,
/// which loads into the sharded state dict in place.
void prepare_to_load(const torch::nn::Module& module);

}  // namespace detail

}  // namespace tdist::fsdp

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
//  full_state_dict = true  : every tensor whole (gathered). With cpu_offload, on CPU; with
//                            rank0_only, only rank 0 returns entries (others: empty).
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
#include "tdist/util/sharded_tensor.h"

namespace tdist::fsdp {

struct StateDictOptions {
  TDIST_ARG(bool, full_state_dict) = false;
  TDIST_ARG(bool, cpu_offload) = false;
  /// Full state dicts only: get returns entries on rank 0 only; set reads them on rank 0
  /// only and broadcasts (Python's broadcast_from_rank0).
  TDIST_ARG(bool, rank0_only) = false;
  /// set_model_state_dict: every parameter and buffer of the module must be present and every
  /// key must name one (InvalidArgument naming the missing / unexpected keys otherwise).
  /// set_optimizer_state_dict: every key must name a state field of a parameter the
  /// optimizer holds (parameters without saved state are fine: no step taken yet).
  TDIST_ARG(bool, strict) = true;
};

/// Collective for full state dicts (all-gathers); local for sharded ones.
ShardedStateDict get_model_state_dict(const torch::nn::Module& module,
                                      const StateDictOptions& options = {});
/// Writes the state dict into the module's (sharded) parameters and buffers in place. A
/// sharded state dict must have this rank's slices; to reshard, use tdist::checkpoint.
void set_model_state_dict(torch::nn::Module& module, const ShardedStateDict& state,
                          const StateDictOptions& options = {});

/// The optimizer's per-parameter state, keyed by parameter name. Parameters without state
/// yet (no step taken) are absent. Supports torch::optim SGD, Adam, AdamW, Adagrad, RMSprop.
ShardedStateDict get_optimizer_state_dict(const torch::nn::Module& module,
                                          torch::optim::Optimizer& optimizer,
                                          const StateDictOptions& options = {});
/// Restores optimizer state (creating per-parameter state where absent).
void set_optimizer_state_dict(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                              const ShardedStateDict& state, const StateDictOptions& options = {});

namespace detail {

/// Reshards every FSDP group under `module` so that writes into the tensors of its sharded
/// state dict take effect (a root left unsharded by a forward-only call would keep using its
/// stale unsharded data). Throws InvalidArgument during forward/backward or inside
/// summon_full_params. set_*_state_dict call it; so does tdist::checkpoint's load_module,
/// which loads into the sharded state dict in place.
void prepare_to_load(const torch::nn::Module& module);

}  // namespace detail

}  // namespace tdist::fsdp

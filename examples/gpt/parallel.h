#pragma once

// How the model is spread over the ranks. The trainer only calls these verbs, so single,
// DDP and FSDP training share one loop:
//   forward(sync) -> backward -> clip_grad_norm -> optimizer step.

#include <memory>
#include <string>

#include <torch/torch.h>

#include "gpt/config.h"
#include "gpt/model.h"
#include "gpt/trace.h"
#include "gpt/world.h"
#include "tdist/util/sharded_tensor.h"

namespace gpt {

class Parallel {
 public:
  virtual ~Parallel() = default;
  /// For the banner: "single", "ddp", "fsdp".
  virtual std::string name() const = 0;
  /// Training forward: logits of idx. sync=false on the micro-steps before the last one of a
  /// step: their backward accumulates gradients locally, without communication (where the
  /// strategy can).
  virtual torch::Tensor forward(const torch::Tensor& idx, bool sync) = 0;
  /// Forward for evaluation and sampling (no backward follows). Collective under FSDP:
  /// every rank must call it the same number of times.
  virtual torch::Tensor forward_eval(const torch::Tensor& idx) = 0;
  /// Back-propagates the loss of the last forward.
  virtual void backward(const torch::Tensor& loss) = 0;
  /// This rank's parameters (shards under FSDP), split for weight decay.
  virtual ParamGroups param_groups() = 0;
  /// Clips the global gradient norm (over all ranks' shards) to max_norm; returns the norm
  /// before clipping.
  virtual double clip_grad_norm(double max_norm) = 0;
  /// This rank's parameters as slices of the whole tensors, named as named_parameters()
  /// names them (whole tensors unless sharded; FSDP: this rank's rows). They alias the
  /// parameters: writing into them loads a checkpoint.
  virtual tdist::ShardedStateDict parameter_slices() = 0;
  /// True when every rank holds the whole model (single, DDP): rank 0 can sample alone.
  virtual bool replicated() const = 0;
  /// The underlying model (under FSDP its parameters are shards outside forward).
  virtual GPT& model() = 0;
};

/// Resolves kAuto (single for one rank; FSDP for several when built, else DDP) and checks
/// that the chosen mode is available in this build, naming the fix when it is not.
ParallelMode resolve_mode(ParallelMode requested, const World& world);

/// Wraps `model` for `mode` (already resolved). Collective for DDP and FSDP: every rank
/// calls it with a model built from the same seed. `cpu_offload` (FSDP only): shards,
/// gradients and optimizer state in host memory.
std::unique_ptr<Parallel> make_parallel(ParallelMode mode, GPT model, const World& world,
                                        Tracer& tracer, bool cpu_offload = false);

}  // namespace gpt

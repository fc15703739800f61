#pragma once

// How the model is spread over the ranks. The trainer only calls these verbs, so single,
// DDP and FSDP training share one loop:
//   forward(sync) -> backward -> clip_grad_norm -> optimizer step.

#include <functional>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "gpt/config.h"
#include "gpt/trace.h"
#include "gpt/world.h"
#include "tdist/detail/util/sharded_tensor.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/models/causal_lm.h"

namespace gpt {

/// The model the trainer trains: any family of tdist::models.
using Model = std::shared_ptr<tdist::models::CausalLM>;

/// Parameters that get weight decay (matrices) and those that do not (biases, norms, GPT-2's
/// position embedding), as in GPT-2 / nanoGPT.
struct ParamGroups {
  std::vector<torch::Tensor> decay;
  std::vector<torch::Tensor> no_decay;
};
ParamGroups split_for_weight_decay(torch::nn::Module& module);

class Parallel {
 public:
  virtual ~Parallel() = default;
  /// For the banner: "single", "ddp", "fsdp".
  virtual std::string name() const = 0;
  /// Training forward: the mean next-token loss of x against y (CausalLM::next_token_loss;
  /// under --tp the logits stay vocabulary-sharded). sync=false on the micro-steps before the
  /// last one of a step: their backward accumulates gradients locally, without
  /// communication (where the strategy can).
  virtual torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, bool sync) = 0;
  /// Forward for evaluation and sampling (no backward follows), extending `cache` when given.
  /// Collective under FSDP: every rank must call it the same number of times.
  virtual torch::Tensor forward_eval(const torch::Tensor& idx,
                                     tdist::models::KVCache* cache = nullptr) = 0;
  /// Back-propagates the loss of the last forward.
  virtual void backward(const torch::Tensor& loss) = 0;
  /// This rank's parameters (shards under FSDP), split for weight decay.
  virtual ParamGroups param_groups() = 0;
  /// Clips the global gradient norm (over all ranks' shards) to max_norm; returns the norm
  /// before clipping, on the gradients' device (nothing waits for the device: read it when
  /// the value is wanted).
  virtual torch::Tensor clip_grad_norm(double max_norm) = 0;
  /// This rank's parameters as slices of the whole tensors, named as named_parameters()
  /// names them (whole tensors unless sharded; FSDP: this rank's rows). They alias the
  /// parameters: writing into them loads a checkpoint.
  virtual tdist::ShardedStateDict parameter_slices() = 0;
  /// True when every rank holds the whole model (single, DDP): rank 0 can sample alone.
  virtual bool replicated() const = 0;
  /// The underlying model (under FSDP its parameters are shards outside forward).
  virtual Model& model() = 0;
};

/// Resolves kAuto (single for one rank; FSDP for several when built, else DDP) and checks
/// that the chosen mode is available in this build, naming the fix when it is not.
ParallelMode resolve_mode(ParallelMode requested, const World& world);

struct ParallelOptions {
  /// FSDP only: shards, gradients and optimizer state in host memory.
  bool cpu_offload = false;
  /// FSDP only: bf16 parameters and activations, float32 gradient reduction.
  bool bf16 = false;
  /// HSDP: replica groups (a 2-D mesh (replicas, world / replicas)); 1: plain FSDP.
  int64_t replicas = 1;
  /// FSDP only: tensor-parallel degree (a (world / tp, tp) mesh); 1: none.
  int64_t tp = 1;
};

/// --replicas for HSDP resolved: `requested` when > 0, else one per node (world /
/// local_world_size) when there are several nodes, else 2. Throws InvalidArgument unless it
/// is at least 2 and divides the world size.
int64_t resolve_replicas(int64_t requested, const World& world);

/// The FSDP options `mode` and `options` ask for (fully_shard's, for models::from_pretrained).
tdist::fsdp::FullyShardOptions fsdp_options(const World& world, const ParallelOptions& options);

/// Wraps `model` for `mode` (already resolved). Collective for DDP and FSDP: every rank
/// calls it with the same model. Under FSDP, `model` may already be sharded (loaded into
/// shards); otherwise it is sharded here. Its parameters must be materialized, except under
/// FSDP, where materialize_fn (if given) runs after sharding, so each rank allocates only
/// its shards.
std::unique_ptr<Parallel> make_parallel(ParallelMode mode, Model model, const World& world,
                                        Tracer& tracer, const ParallelOptions& options = {},
                                        const std::function<void(Model&)>& materialize_fn = {});

}  // namespace gpt

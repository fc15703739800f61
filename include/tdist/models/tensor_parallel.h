#pragma once

// Tensor parallelism for the Llama-like families (Llama, Mistral, Qwen2), torchtitan's
// apply_tp for Llama: attention's q/k/v projections and the MLP's gate/up projections
// column-parallel, o_proj and down_proj row-parallel, the embedding vocabulary-parallel and
// the head column-parallel. With sequence parallelism (the default, as in torchtitan) the
// residual stream and the norms are split along the sequence between the blocks: each
// attention and MLP gathers its input once (an all-gather) and reduce-scatters its output,
// where without it they all-reduce the output and every rank computes the norms on the whole
// sequence. With loss parallelism (the default) next_token_loss takes the cross-entropy of
// the vocabulary-sharded logits without gathering them. Compose with FSDP by applying this
// first (on mesh["tp"]), then fully_shard_model over mesh["dp"].

#include <memory>

#include <torch/arg.h>

#include "tdist/mesh/device_mesh.h"
#include "tdist/models/causal_lm.h"
#include "tdist/tensor/parallel/style.h"

namespace tdist::models {

struct TensorParallelOptions {
  /// Norms and the residual stream on sequence shards (SequenceParallel): activations
  /// between the blocks take 1/tp of the memory, for the same bytes sent (an all-gather and a
  /// reduce-scatter in place of each all-reduce). A forward pads its sequence with trailing
  /// tokens to a multiple of the tensor-parallel degree (they change no real position's
  /// output: attention is causal) and drops them from the logits and the KV cache.
  TORCH_ARG(bool, sequence_parallel) = true;
  /// The head's logits stay sharded along the vocabulary for CausalLM::next_token_loss
  /// (loss_parallel). Only an untied head is sharded; forward() still returns whole logits.
  TORCH_ARG(bool, loss_parallel) = true;
};

/// The plan apply_tensor_parallel uses, for a model of `config` (keys as named_modules()).
tensor::parallel::ParallelizePlan tensor_parallel_plan(const ModelConfig& config,
                                                       const TensorParallelOptions& options = {});

/// Parallelizes `model` over the 1-D `tp_mesh`. Every rank calls it on identically
/// initialised models (the first rank's weights are distributed). Errors (InvalidArgument):
/// GPT-2 (its fused c_attn projection does not split by heads), a head or KV-head count the
/// mesh size does not divide. With tied embeddings the embedding and head stay replicated.
void apply_tensor_parallel(const std::shared_ptr<CausalLM>& model, const mesh::DeviceMesh& tp_mesh,
                           const TensorParallelOptions& options = {});

}  // namespace tdist::models

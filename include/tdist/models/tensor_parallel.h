#pragma once

// Tensor parallelism for the Llama-like families (Llama, Mistral, Qwen2), as torchtitan's
// apply_tp does for Llama: attention's q/k/v projections and the MLP's gate/up projections
// column-parallel, o_proj and down_proj row-parallel (one all-reduce per attention and per
// MLP in the forward, one each in the backward), the embedding vocabulary-parallel and the
// head column-parallel with replicated logits. Norms compute on every rank. Compose with
// FSDP by applying this first (on mesh["tp"]), then fully_shard_model over mesh["dp"].

#include <memory>

#include "tdist/mesh/device_mesh.h"
#include "tdist/models/causal_lm.h"
#include "tdist/tensor/parallel/style.h"

namespace tdist::models {

/// The plan apply_tensor_parallel uses, for a model of `config` (keys as named_modules()).
tensor::parallel::ParallelizePlan tensor_parallel_plan(const ModelConfig& config);

/// Parallelizes `model` over the 1-D `tp_mesh`. Every rank calls it on identically
/// initialised models (the first rank's weights are distributed). Errors (InvalidArgument):
/// GPT-2 (its fused c_attn projection does not split by heads), a head or KV-head count the
/// mesh size does not divide. With tied embeddings the embedding and head stay replicated.
void apply_tensor_parallel(const std::shared_ptr<CausalLM>& model, const mesh::DeviceMesh& tp_mesh);

}  // namespace tdist::models

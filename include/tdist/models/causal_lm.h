#pragma once

// The interface every decoder family implements: token ids in, next-token logits out, its
// transformer layers listed for fully_shard (one FSDP unit each, as torchtitan shards).
//
// Parameter names are Hugging Face's (model.layers.0.self_attn.q_proj.weight,
// transformer.h.0.attn.c_attn.weight, ...), so a model's state dict and its safetensors
// files use the same keys and loading is a copy, never a renaming.
//
// A layer that fully_shard was applied to is called through tdist::fsdp::forward, so one
// model serves sharded and unsharded runs; the caller runs the whole model through
// tdist::fsdp::forward(model, input_ids) when the root is sharded too.

#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "tdist/models/config.h"
#include "tdist/models/kv_cache.h"
#include "tdist/models/layers.h"
#include "tdist/tensor/dtensor.h"

namespace tdist::models {

class CausalLM : public torch::nn::Module {
 public:
  ~CausalLM() override = default;

  const ModelConfig& config() const { return config_; }

  /// input_ids [B, T] (integer) -> logits [B, T, vocab_size] in the parameters' dtype.
  /// With a cache, input_ids are the positions after the cached ones, which they attend to,
  /// and the cache is extended by them. The positions (cached + T) may not exceed
  /// max_position_embeddings (InvalidArgument naming both), except with dynamic rope
  /// scaling, whose purpose is longer sequences.
  at::Tensor forward(const at::Tensor& input_ids, KVCache* cache = nullptr);

  /// The training loss: the mean cross-entropy (float32, or float64 for a float64 model) of the
  /// logits at every position against `targets` [B, T], the tokens that follow (-100: ignored);
  /// equal to cross_entropy(forward(input_ids), targets). With a vocabulary-parallel head
  /// (apply_tensor_parallel's loss_parallel) the logits are never gathered: each rank keeps
  /// its share of the vocabulary (loss_parallel_cross_entropy). On a sharded root call it
  /// through tdist::fsdp::forward_method(model, &CausalLM::next_token_loss, ids, targets).
  at::Tensor next_token_loss(const at::Tensor& input_ids, const at::Tensor& targets);

  /// Recompute each decoder layer's activations in backward instead of keeping them
  /// (tdist::fsdp::checkpointed_forward around every layer): less memory, one more forward.
  void set_activation_checkpointing(bool on) { activation_checkpointing_ = on; }
  bool activation_checkpointing() const { return activation_checkpointing_; }

  /// The decoder layers in order: the modules fully_shard shards one by one.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> layers() const = 0;

 protected:
  CausalLM(const std::string& name, ModelConfig config);
  /// The context every layer of this forward shares: the cache, its length and the layer
  /// count filled in.
  LayerContext layer_context(KVCache* cache) const;
  virtual at::Tensor logits(const at::Tensor& input_ids, KVCache* cache) = 0;
  /// Logits [B, T, vocab] sharded along the vocabulary, when the head is loss-parallel;
  /// nullopt: next_token_loss uses logits().
  virtual std::optional<tensor::DTensor> vocab_parallel_logits(const at::Tensor& input_ids) {
    (void)input_ids;
    return std::nullopt;
  }

 private:
  void check_input_ids(const at::Tensor& input_ids, int64_t cached) const;

  ModelConfig config_;
  bool activation_checkpointing_ = false;
};

/// transformers' causal LM loss: the logits at position t predict labels[t + 1]; labels of
/// -100 are ignored; the mean is taken in float32.
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels);

/// The targets next_token_loss takes for a batch that predicts its own next tokens:
/// input_ids shifted left by one, -100 (ignored) at each sequence's last position.
at::Tensor next_token_targets(const at::Tensor& input_ids);

}  // namespace tdist::models

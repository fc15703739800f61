#pragma once

// LlamaForCausalLM, the architecture Llama 2 / 3 / 3.1+, Mistral and Qwen2 share: token
// embedding, pre-norm decoder layers (RMSNorm, grouped-query attention with rotary
// embeddings, a gated MLP), a final RMSNorm and the LM head. The families differ only in
// settings ModelConfig carries: q/k/v and output biases, MLP biases, rope scaling, and
// sliding-window attention per layer.

#include <memory>
#include <optional>
#include <vector>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "tdist/mesh/device_mesh.h"
#include "tdist/models/causal_lm.h"
#include "tdist/models/layers.h"

namespace tdist::models {

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const ModelConfig& config, int64_t layer_index);
  at::Tensor forward(const at::Tensor& x, const LayerContext& context);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t layer_index_, heads_, kv_heads_, head_dim_, window_;
  double dropout_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  std::string act_;
};
TORCH_MODULE(LlamaMLP);

/// x + attn(norm(x)), then x + mlp(norm(x)): the unit FSDP shards.
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const ModelConfig& config, int64_t layer_index);
  at::Tensor forward(const at::Tensor& x, const LayerContext& context);

  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

/// The decoder without its head ("model." in the checkpoint).
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const ModelConfig& config);

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};  ///< of LlamaDecoderLayer
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLM : public CausalLM {
 public:
  /// Parameters initialised by LibTorch's layer defaults; use from_pretrained, or
  /// initialize_weights (tdist/models/pretrained.h) for transformers' initialisation.
  explicit LlamaForCausalLM(const ModelConfig& config);
  std::vector<std::shared_ptr<torch::nn::Module>> layers() const override;

  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  ///< null with tie_word_embeddings

 protected:
  at::Tensor logits(const at::Tensor& input_ids, KVCache* cache) override;
  std::optional<tensor::DTensor> vocab_parallel_logits(const at::Tensor& input_ids) override;

 private:
  /// The final norm's output [B, T', H]: under sequence parallelism this rank's shard of
  /// the sequence padded to T' (a multiple of the degree), else the whole sequence.
  at::Tensor hidden_states(const at::Tensor& input_ids, KVCache* cache);
  /// The tensor-parallel mesh when apply_tensor_parallel split the sequence; else nullopt.
  std::optional<mesh::DeviceMesh> sequence_parallel_mesh() const;
};

}  // namespace tdist::models

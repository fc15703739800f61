#pragma once

// GPT2LMHeadModel: token and learned position embeddings, pre-LayerNorm blocks of fused-qkv
// attention and a GELU MLP over GPT-2's Conv1D layers, a final LayerNorm and the LM head
// (tied to the token embedding unless tie_word_embeddings is false).

#include <memory>
#include <vector>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "tdist/models/causal_lm.h"
#include "tdist/models/layers.h"

namespace tdist::models {

class GPT2AttentionImpl : public torch::nn::Module {
 public:
  GPT2AttentionImpl(const ModelConfig& config, int64_t layer_index);
  at::Tensor forward(const at::Tensor& x, const LayerContext& context);

  Conv1D c_attn{nullptr}, c_proj{nullptr};

 private:
  int64_t layer_index_, heads_, head_dim_;
  double scale_, attn_dropout_, resid_dropout_;
};
TORCH_MODULE(GPT2Attention);

class GPT2MLPImpl : public torch::nn::Module {
 public:
  explicit GPT2MLPImpl(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x);

  Conv1D c_fc{nullptr}, c_proj{nullptr};

 private:
  std::string act_;
  double dropout_;
};
TORCH_MODULE(GPT2MLP);

class GPT2BlockImpl : public torch::nn::Module {
 public:
  GPT2BlockImpl(const ModelConfig& config, int64_t layer_index);
  at::Tensor forward(const at::Tensor& x, const LayerContext& context);

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  GPT2Attention attn{nullptr};
  GPT2MLP mlp{nullptr};
};
TORCH_MODULE(GPT2Block);

/// The decoder without its head ("transformer." in the checkpoint).
class GPT2ModelImpl : public torch::nn::Module {
 public:
  explicit GPT2ModelImpl(const ModelConfig& config);

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};  ///< of GPT2Block
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GPT2Model);

class GPT2LMHeadModel : public CausalLM {
 public:
  explicit GPT2LMHeadModel(const ModelConfig& config);
  std::vector<std::shared_ptr<torch::nn::Module>> layers() const override;

  GPT2Model transformer{nullptr};
  torch::nn::Linear lm_head{nullptr};  ///< null with tie_word_embeddings (GPT-2's default)

 protected:
  at::Tensor logits(const at::Tensor& input_ids, KVCache* cache) override;
};

}  // namespace tdist::models

#pragma once

// A GPT-2-style decoder: token + position embeddings, N blocks of pre-LayerNorm causal
// self-attention and MLP, a final LayerNorm and a language-model head (tied to the token
// embedding or not). Small enough to train on a laptop CPU; the same module is what the
// training benchmarks (bench/train, bench/fsdp) time.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gpt/model_config.h"

namespace gpt {

/// Causal multi-head self-attention: one fused qkv projection, a causal mask, an output
/// projection.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_attn{nullptr};
  torch::nn::Linear c_proj{nullptr};

 private:
  int64_t n_head_;
  int64_t n_embd_;
  int64_t block_size_;
  torch::nn::Dropout attn_dropout_{nullptr};
  torch::nn::Dropout resid_dropout_{nullptr};
  torch::Tensor mask_;  // [1, 1, block, block] lower-triangular (true: may attend)
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_fc{nullptr};
  torch::nn::Linear c_proj{nullptr};

 private:
  torch::nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(Mlp);

/// One transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)). The unit FSDP shards.
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  /// Parameters are initialised from the global torch seed (call torch::manual_seed first
  /// for the same model on every rank).
  explicit GPTImpl(const ModelConfig& config);

  /// idx: [B, T] int64 token ids with T <= block_size. Returns logits [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& idx);
  /// Mean cross-entropy of forward(idx) against targets [B, T].
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);

  const ModelConfig& config() const { return config_; }

  /// GPT-2's initialisation of the parameters `module` holds itself, `name` being its name in
  /// the model (as named_modules()): deferred init's per-module init_fn, the same rule the
  /// constructor applies to the whole model.
  static void init_module(const ModelConfig& config, const std::string& name,
                          torch::nn::Module& module);

  /// How forward() calls each block. Default: block->forward(x). FSDP installs
  /// tdist::fsdp::forward here so each sharded block is gathered around its call, which
  /// keeps this model free of any dependency on tdist.
  using BlockRunner =
      std::function<torch::Tensor(const std::shared_ptr<BlockImpl>&, const torch::Tensor&)>;
  void set_block_runner(BlockRunner runner) { block_runner_ = std::move(runner); }
  /// The blocks, typed.
  std::vector<std::shared_ptr<BlockImpl>> block_list() const;

  torch::nn::Embedding wte{nullptr};  // token embedding [vocab, C]
  torch::nn::Embedding wpe{nullptr};  // position embedding [block, C]
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList blocks{nullptr};  // of Block
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_weights

 private:
  void init_weights();
  ModelConfig config_;
  BlockRunner block_runner_;
};
TORCH_MODULE(GPT);

}  // namespace gpt

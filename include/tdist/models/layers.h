#pragma once

// The building blocks the decoder families share, each computing what its transformers
// counterpart computes: RMSNorm (LlamaRMSNorm), Conv1D (GPT-2's transposed linear), the
// activations config.json names, and causal attention through ATen's
// scaled_dot_product_attention with grouped-query heads and sliding windows.

#include <cstdint>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "tdist/models/kv_cache.h"

namespace tdist::models {

/// weight * (x / sqrt(mean(x^2) + eps)), the normalisation computed in float32 and cast back
/// to x's dtype before the weight is applied, as transformers does.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t hidden_size, double eps);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

/// GPT-2's Conv1D: a linear layer whose weight is stored [in, out] (so a GPT-2 checkpoint's
/// tensors load as they are): x @ weight + bias.
class Conv1DImpl : public torch::nn::Module {
 public:
  Conv1DImpl(int64_t in_features, int64_t out_features);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;  ///< [in, out]
  at::Tensor bias;    ///< [out]
};
TORCH_MODULE(Conv1D);

/// config.json's hidden_act / activation_function: silu (swish), gelu, gelu_new and
/// gelu_pytorch_tanh (the tanh approximation), relu.
at::Tensor activation(const std::string& name, const at::Tensor& x);

/// What every decoder layer of one forward shares: the rotary tables (Llama-like families),
/// the attention masks, made once per forward rather than once per layer, and the KV cache
/// when one is used.
struct LayerContext {
  at::Tensor cos;  ///< [T, head_dim] for positions past..past+T-1, in the hidden states' dtype
  at::Tensor sin;
  /// Boolean masks [T, past + T] (true: may attend) by sliding window (0: causal only). A
  /// window covering every key needs none; neither does causal attention without cached
  /// positions (SDPA's is_causal path) or one new token after them (it sees them all).
  std::map<int64_t, at::Tensor> window_masks;
  /// The cache this forward reads and extends (null: none), the positions it held before
  /// this forward, and the model's layer count.
  KVCache* cache = nullptr;
  int64_t past = 0;
  int64_t num_layers = 0;

  /// Adds the mask `window` needs for `length` new positions on `device` (see mask_key).
  void add_window(int64_t window, int64_t length, const c10::Device& device);
  /// The key of window_masks `window` uses with `keys` key positions; -1: no mask needed.
  int64_t mask_key(int64_t window, int64_t queries, int64_t keys) const;
  /// Keys and values [B, Hkv, past + T, D] of layer `layer`: with a cache, this forward's
  /// appended to the cached ones; without, these.
  std::pair<at::Tensor, at::Tensor> keys_values(int64_t layer, const at::Tensor& keys,
                                                const at::Tensor& values) const;
};

/// Causal self-attention of q [B, H, T, D] over k, v [B, Hkv, past + T, D] (H a multiple of
/// Hkv; the queries are the last T positions):
/// SDPA with grouped-query heads, a sliding window (0: none), dropout and the given scale.
/// Returns [B, T, H * D].
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const LayerContext& context, int64_t window, double dropout,
                            double scale);

}  // namespace tdist::models

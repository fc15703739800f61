#include "tdist/models/layers.h"

#include <cmath>

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include "tdist/error.h"

namespace tdist::models {

RMSNormImpl::RMSNormImpl(int64_t hidden_size, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({hidden_size}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (h * at::rsqrt(variance + eps_)).to(x.scalar_type());
}

Conv1DImpl::Conv1DImpl(int64_t in_features, int64_t out_features) {
  weight = register_parameter("weight", at::empty({in_features, out_features}));
  bias = register_parameter("bias", at::zeros({out_features}));
  torch::NoGradGuard no_grad;
  weight.normal_(0.0, 0.02);
}

at::Tensor Conv1DImpl::forward(const at::Tensor& x) {
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = weight.size(1);
  return at::addmm(bias, x.reshape({-1, x.size(-1)}), weight).view(out_shape);
}

at::Tensor activation(const std::string& name, const at::Tensor& x) {
  if (name == "silu" || name == "swish") return at::silu(x);
  if (name == "gelu") return at::gelu(x);
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  if (name == "relu") return at::relu(x);
  TDIST_THROW(InvalidArgument, "models: activation '" + name + "' is not implemented");
}

int64_t LayerContext::mask_key(int64_t window, int64_t queries, int64_t keys) const {
  const int64_t key = window > 0 && window < keys ? window : 0;
  if (key == 0 && (keys == queries || queries == 1)) return -1;
  return key;
}

void LayerContext::add_window(int64_t window, int64_t length, const c10::Device& device) {
  const int64_t keys = past + length;
  const int64_t key = mask_key(window, length, keys);
  if (key < 0 || window_masks.count(key)) return;
  const auto options = at::TensorOptions().device(device);
  const at::Tensor query = at::arange(past, keys, options).unsqueeze(1);
  const at::Tensor kv = at::arange(keys, options).unsqueeze(0);
  // transformers' causal mask with its sliding_window_overlay: kv <= q and kv > q - window.
  at::Tensor mask = kv.le(query);
  if (key > 0) mask = mask.logical_and(kv.gt(query - key));
  window_masks[key] = mask;
}

std::pair<at::Tensor, at::Tensor> LayerContext::keys_values(int64_t layer, const at::Tensor& keys,
                                                            const at::Tensor& values) const {
  if (cache == nullptr) return {keys, values};
  return cache->append(layer, keys, values, num_layers);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const LayerContext& context, int64_t window, double dropout,
                            double scale) {
  const bool grouped = q.size(1) != k.size(1);
  const int64_t queries = q.size(2), keys = k.size(2);
  const int64_t key = context.mask_key(window, queries, keys);
  at::Tensor out;
  if (key >= 0) {
    auto it = context.window_masks.find(key);
    TDIST_CHECK_ARG(it != context.window_masks.end(),
                    "models internal: no attention mask for sliding window " + std::to_string(key));
    out = at::scaled_dot_product_attention(q, k, v, it->second, dropout, /*is_causal=*/false, scale,
                                           grouped);
  } else {
    // No cached positions: SDPA's causal path. One new token after cached ones: it may
    // attend to every key.
    out = at::scaled_dot_product_attention(q, k, v, std::nullopt, dropout,
                                           /*is_causal=*/queries == keys && queries > 1, scale,
                                           grouped);
  }
  // [B, H, T, D] -> [B, T, H * D]
  return out.transpose(1, 2).reshape({q.size(0), queries, -1});
}

}  // namespace tdist::models

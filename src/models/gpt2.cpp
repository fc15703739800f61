#include "tdist/models/gpt2.h"

#include <cmath>

#include <ATen/ATen.h>

#include "tdist/fsdp/activation_checkpoint.h"
#include "tdist/fsdp/forward.h"

namespace tdist::models {
namespace {

at::Tensor maybe_dropout(const at::Tensor& x, double p, bool training) {
  return training && p > 0 ? at::dropout(x, p, true) : x;
}

torch::nn::LayerNorm layer_norm(const ModelConfig& c) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden_size}).eps(c.norm_eps));
}

}  // namespace

GPT2AttentionImpl::GPT2AttentionImpl(const ModelConfig& c, int64_t layer_index)
    : layer_index_(layer_index),
      heads_(c.num_attention_heads),
      head_dim_(c.head_dim),
      attn_dropout_(c.attention_dropout),
      resid_dropout_(c.residual_dropout) {
  scale_ = c.scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(head_dim_)) : 1.0;
  if (c.scale_attn_by_inverse_layer_idx) scale_ /= static_cast<double>(layer_index + 1);
  c_attn = register_module("c_attn", Conv1D(c.hidden_size, 3 * c.hidden_size));
  c_proj = register_module("c_proj", Conv1D(c.hidden_size, c.hidden_size));
}

at::Tensor GPT2AttentionImpl::forward(const at::Tensor& x, const LayerContext& context) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const auto qkv = c_attn->forward(x).split(c, 2);
  auto heads = [&](const at::Tensor& y) {
    return y.view({b, t, heads_, head_dim_}).transpose(1, 2);
  };
  const auto [k, v] = context.keys_values(layer_index_, heads(qkv[1]), heads(qkv[2]));
  const at::Tensor y = causal_attention(heads(qkv[0]), k, v, context, 0,
                                        is_training() ? attn_dropout_ : 0.0, scale_);
  return maybe_dropout(c_proj->forward(y), resid_dropout_, is_training());
}

GPT2MLPImpl::GPT2MLPImpl(const ModelConfig& c) : act_(c.hidden_act), dropout_(c.residual_dropout) {
  c_fc = register_module("c_fc", Conv1D(c.hidden_size, c.intermediate_size));
  c_proj = register_module("c_proj", Conv1D(c.intermediate_size, c.hidden_size));
}

at::Tensor GPT2MLPImpl::forward(const at::Tensor& x) {
  return maybe_dropout(c_proj->forward(activation(act_, c_fc->forward(x))), dropout_,
                       is_training());
}

GPT2BlockImpl::GPT2BlockImpl(const ModelConfig& c, int64_t layer_index) {
  ln_1 = register_module("ln_1", layer_norm(c));
  attn = register_module("attn", GPT2Attention(c, layer_index));
  ln_2 = register_module("ln_2", layer_norm(c));
  mlp = register_module("mlp", GPT2MLP(c));
}

at::Tensor GPT2BlockImpl::forward(const at::Tensor& x, const LayerContext& context) {
  const at::Tensor h = x + attn->forward(ln_1->forward(x), context);
  return h + mlp->forward(ln_2->forward(h));
}

GPT2ModelImpl::GPT2ModelImpl(const ModelConfig& c) {
  wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  wpe = register_module("wpe", torch::nn::Embedding(c.max_position_embeddings, c.hidden_size));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) h->push_back(GPT2Block(c, i));
  ln_f = register_module("ln_f", layer_norm(c));
}

GPT2LMHeadModel::GPT2LMHeadModel(const ModelConfig& c) : CausalLM(architecture_of(c.family), c) {
  transformer = register_module("transformer", GPT2Model(c));
  if (!c.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head",
        torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
  }
}

std::vector<std::shared_ptr<torch::nn::Module>> GPT2LMHeadModel::layers() const {
  return std::vector<std::shared_ptr<torch::nn::Module>>(transformer->h->begin(),
                                                         transformer->h->end());
}

at::Tensor GPT2LMHeadModel::logits(const at::Tensor& input_ids, KVCache* cache) {
  const int64_t length = input_ids.size(1);
  LayerContext context = layer_context(cache);
  const at::Tensor positions =
      at::arange(context.past, context.past + length,
                 at::TensorOptions().dtype(at::kLong).device(input_ids.device()));
  at::Tensor x = transformer->wte->forward(input_ids) + transformer->wpe->forward(positions);
  x = maybe_dropout(x, config().embedding_dropout, is_training());
  context.add_window(0, length, x.device());
  for (size_t i = 0; i < transformer->h->size(); ++i) {
    auto block = transformer->h->ptr<GPT2BlockImpl>(i);
    x = activation_checkpointing() ? fsdp::checkpointed_forward(block, x, context)
                                   : fsdp::forward(block, x, context);
  }
  x = transformer->ln_f->forward(x);
  return lm_head ? lm_head->forward(x) : at::linear(x, transformer->wte->weight);
}

}  // namespace tdist::models

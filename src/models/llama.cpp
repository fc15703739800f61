#include "tdist/models/llama.h"

#include <cmath>

#include <ATen/ATen.h>

#include "tdist/fsdp/activation_checkpoint.h"
#include "tdist/fsdp/forward.h"
#include "tdist/models/rotary.h"
#include "tdist/tensor/parallel/parallelize.h"

namespace tdist::models {
namespace {

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// A submodule, through its tensor-parallel style when apply_tensor_parallel gave it one.
template <class Holder, class... Rest>
at::Tensor call(Holder& module, const at::Tensor& x, Rest&&... rest) {
  if (tensor::parallel::style_of(*module) != nullptr) {
    return tensor::parallel::forward(module, x, std::forward<Rest>(rest)...);
  }
  return module->forward(x, std::forward<Rest>(rest)...);
}

// The sequence with trailing tokens appended up to a multiple of `multiple`.
at::Tensor padded(const at::Tensor& input_ids, int64_t multiple) {
  const int64_t pad = (multiple - input_ids.size(1) % multiple) % multiple;
  return pad == 0 ? input_ids : at::constant_pad_nd(input_ids, {0, pad}, 0);
}

}  // namespace

LlamaAttentionImpl::LlamaAttentionImpl(const ModelConfig& c, int64_t layer_index)
    : layer_index_(layer_index),
      heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      window_(c.sliding_windows.at(static_cast<size_t>(layer_index))),
      dropout_(c.attention_dropout) {
  q_proj = register_module("q_proj", linear(c.hidden_size, heads_ * head_dim_, c.qkv_bias));
  k_proj = register_module("k_proj", linear(c.hidden_size, kv_heads_ * head_dim_, c.qkv_bias));
  v_proj = register_module("v_proj", linear(c.hidden_size, kv_heads_ * head_dim_, c.qkv_bias));
  o_proj = register_module("o_proj", linear(heads_ * head_dim_, c.hidden_size, c.o_bias));
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const LayerContext& context) {
  const int64_t b = x.size(0), t = x.size(1);
  // Counted from the projection: under tensor parallelism each rank holds a share of heads.
  auto heads = [&](const at::Tensor& y) {
    return y.view({b, t, y.size(-1) / head_dim_, head_dim_}).transpose(1, 2);  // [B, n, T, D]
  };
  const at::Tensor q = apply_rotary(heads(call(q_proj, x)), context.cos, context.sin);
  const auto [k, v] = context.keys_values(
      layer_index_, apply_rotary(heads(call(k_proj, x)), context.cos, context.sin),
      heads(call(v_proj, x)));
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  const at::Tensor y =
      causal_attention(q, k, v, context, window_, is_training() ? dropout_ : 0.0, scale);
  return call(o_proj, y);
}

LlamaMLPImpl::LlamaMLPImpl(const ModelConfig& c) : act_(c.hidden_act) {
  gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size, c.mlp_bias));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) {
  return call(down_proj, activation(act_, call(gate_proj, x)) * call(up_proj, x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const ModelConfig& c, int64_t layer_index) {
  self_attn = register_module("self_attn", LlamaAttention(c, layer_index));
  mlp = register_module("mlp", LlamaMLP(c));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.norm_eps));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const LayerContext& context) {
  const at::Tensor h = x + call(self_attn, call(input_layernorm, x), context);
  return h + call(mlp, call(post_attention_layernorm, h));
}

LlamaModelImpl::LlamaModelImpl(const ModelConfig& c) {
  // transformers gives the embedding the pad token as padding_idx: that row gets no gradient.
  auto options = torch::nn::EmbeddingOptions(c.vocab_size, c.hidden_size);
  if (c.pad_token_id && *c.pad_token_id >= 0 && *c.pad_token_id < c.vocab_size) {
    options.padding_idx(*c.pad_token_id);
  }
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(options));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(c, i));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.norm_eps));
}

LlamaForCausalLM::LlamaForCausalLM(const ModelConfig& c) : CausalLM(architecture_of(c.family), c) {
  model = register_module("model", LlamaModel(c));
  if (!c.tie_word_embeddings) {
    lm_head = register_module("lm_head", linear(c.hidden_size, c.vocab_size, false));
  }
}

std::vector<std::shared_ptr<torch::nn::Module>> LlamaForCausalLM::layers() const {
  return std::vector<std::shared_ptr<torch::nn::Module>>(model->layers->begin(),
                                                         model->layers->end());
}

std::optional<mesh::DeviceMesh> LlamaForCausalLM::sequence_parallel_mesh() const {
  const auto style = tensor::parallel::style_of(*model->norm);
  if (dynamic_cast<const tensor::parallel::SequenceParallel*>(style.get()) == nullptr) {
    return std::nullopt;
  }
  return tensor::parallel::parameter_placement(model->norm->weight)->mesh;
}

// Under sequence parallelism the sequence is split over the ranks evenly, so it is padded
// with trailing tokens first: attention is causal, so no real position sees them, and
// callers drop their outputs (TensorParallelOptions::sequence_parallel).
at::Tensor LlamaForCausalLM::hidden_states(const at::Tensor& input_ids, KVCache* cache) {
  const auto sp = sequence_parallel_mesh();
  const int64_t length = input_ids.size(1);
  const at::Tensor ids = sp ? padded(input_ids, sp->size()) : input_ids;
  const int64_t padding = ids.size(1) - length;
  at::Tensor x = call(model->embed_tokens, ids);
  LayerContext context = layer_context(cache);
  std::tie(context.cos, context.sin) =
      rope_tables(config(), context.past + length, x.device(), x.scalar_type());
  context.cos =
      at::constant_pad_nd(context.cos.narrow(0, context.past, length), {0, 0, 0, padding});
  context.sin =
      at::constant_pad_nd(context.sin.narrow(0, context.past, length), {0, 0, 0, padding});
  for (int64_t window : config().sliding_windows) {
    context.add_window(window, ids.size(1), x.device());
  }
  for (size_t i = 0; i < model->layers->size(); ++i) {
    auto layer = model->layers->ptr<LlamaDecoderLayerImpl>(i);
    x = activation_checkpointing() ? fsdp::checkpointed_forward(layer, x, context)
                                   : fsdp::forward(layer, x, context);
  }
  if (cache != nullptr && padding > 0) cache->crop(context.past + length);
  return call(model->norm, x);
}

at::Tensor LlamaForCausalLM::logits(const at::Tensor& input_ids, KVCache* cache) {
  at::Tensor x = hidden_states(input_ids, cache);
  at::Tensor out;
  if (!lm_head) {
    // Tied: the embedding's whole weight, so the whole sequence.
    if (const auto sp = sequence_parallel_mesh()) {
      x = tensor::DTensor::from_local(x, *sp, {tensor::Shard(1)}).full_tensor();
    }
    out = at::linear(x, model->embed_tokens->weight);
  } else if (tensor::parallel::style_of(*lm_head) != nullptr) {
    out = tensor::parallel::forward_dtensor(lm_head, x).full_tensor();
  } else {
    out = lm_head->forward(x);
  }
  return out.narrow(1, 0, input_ids.size(1));
}

std::optional<tensor::DTensor> LlamaForCausalLM::vocab_parallel_logits(
    const at::Tensor& input_ids) {
  if (!lm_head) return std::nullopt;
  const auto* head = dynamic_cast<const tensor::parallel::ColwiseParallel*>(
      tensor::parallel::style_of(*lm_head).get());
  if (head == nullptr || !tensor::is_shard(head->output_layouts())) return std::nullopt;
  const tensor::DTensor logits =
      tensor::parallel::forward_dtensor(lm_head, hidden_states(input_ids, nullptr));
  std::vector<int64_t> shape = logits.shape();
  shape[1] = input_ids.size(1);
  return tensor::DTensor::from_local(logits.to_local().narrow(1, 0, shape[1]), logits.device_mesh(),
                                     logits.placements(), tensor::FromLocalOptions().shape(shape));
}

}  // namespace tdist::models

#include "gpt/model.h"

#include <cmath>

#include "tdist/error.h"

namespace gpt {

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelConfig& config)
    : n_head_(config.n_head), n_embd_(config.n_embd), block_size_(config.block_size) {
  c_attn = register_module("c_attn", torch::nn::Linear(n_embd_, 3 * n_embd_));
  c_proj = register_module("c_proj", torch::nn::Linear(n_embd_, n_embd_));
  attn_dropout_ = register_module("attn_dropout", torch::nn::Dropout(config.dropout));
  resid_dropout_ = register_module("resid_dropout", torch::nn::Dropout(config.dropout));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const int64_t hd = c / n_head_;
  auto qkv = c_attn->forward(x).split(n_embd_, /*dim=*/2);
  auto q = qkv[0].view({b, t, n_head_, hd}).transpose(1, 2);  // [B, H, T, hd]
  auto k = qkv[1].view({b, t, n_head_, hd}).transpose(1, 2);
  auto v = qkv[2].view({b, t, n_head_, hd}).transpose(1, 2);
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  using torch::indexing::Slice;
  // Not a registered buffer: it is derived from the config, so it stays out of state dicts,
  // checkpoints and DDP's buffer broadcast (gloo has no bool collectives). Made at the first
  // forward, on the input's device (a model built on the meta device has no data to copy).
  if (!mask_.defined() || mask_.device() != x.device()) {
    mask_ = torch::tril(torch::ones({block_size_, block_size_}, x.options().dtype(torch::kBool)))
                .view({1, 1, block_size_, block_size_});
  }
  auto mask = mask_.index({Slice(), Slice(), Slice(0, t), Slice(0, t)});
  att = att.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  att = attn_dropout_->forward(torch::softmax(att, -1));
  auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, c});
  return resid_dropout_->forward(c_proj->forward(y));
}

MlpImpl::MlpImpl(const ModelConfig& config) {
  c_fc = register_module("c_fc", torch::nn::Linear(config.n_embd, 4 * config.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * config.n_embd, config.n_embd));
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return dropout_->forward(c_proj->forward(torch::gelu(c_fc->forward(x))));
}

BlockImpl::BlockImpl(const ModelConfig& config) {
  ln_1 =
      register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  attn = register_module("attn", CausalSelfAttention(config));
  ln_2 =
      register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  mlp = register_module("mlp", Mlp(config));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attn->forward(ln_1->forward(x));
  return h + mlp->forward(ln_2->forward(h));
}

GPTImpl::GPTImpl(const ModelConfig& config) : config_(config) {
  config_.validate();
  wte = register_module("wte", torch::nn::Embedding(config.vocab_size, config.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(config.block_size, config.n_embd));
  drop = register_module("drop", torch::nn::Dropout(config.dropout));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layer; ++i) blocks->push_back(Block(config));
  ln_f =
      register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  if (!config.tie_weights) {
    lm_head = register_module(
        "lm_head",
        torch::nn::Linear(torch::nn::LinearOptions(config.n_embd, config.vocab_size).bias(false)));
  }
  init_weights();
}

namespace {

// GPT-2 initialisation: N(0, 0.02) everywhere, residual projections scaled by
// 1/sqrt(2 * n_layer) so the residual stream's variance does not grow with depth.
double residual_std(const ModelConfig& config) {
  return 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
}

// `name`: the parameter's name in the model.
void init_parameter(const std::string& name, torch::Tensor& p, double resid_std) {
  const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
  if (name.find("ln_") != std::string::npos) {
    if (is_bias)
      p.zero_();
    else
      p.fill_(1.0);
  } else if (is_bias) {
    p.zero_();
  } else if (name.find("c_proj.weight") != std::string::npos) {
    p.normal_(0.0, resid_std);
  } else {
    p.normal_(0.0, 0.02);
  }
}

}  // namespace

void GPTImpl::init_weights() {
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters()) {
    init_parameter(item.key(), item.value(), residual_std(config_));
  }
}

void GPTImpl::init_module(const ModelConfig& config, const std::string& name,
                          torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(/*recurse=*/false)) {
    init_parameter(name.empty() ? item.key() : name + "." + item.key(), item.value(),
                   residual_std(config));
  }
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  const int64_t t = idx.size(1);
  TDIST_CHECK_ARG(t <= config_.block_size,
                  "GPT forward: sequence length " + std::to_string(t) + " exceeds block_size " +
                      std::to_string(config_.block_size) + "; crop the input");
  auto pos = torch::arange(t, idx.options().dtype(torch::kLong));
  auto x = drop->forward(wte->forward(idx) + wpe->forward(pos));
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto block = blocks->ptr<BlockImpl>(i);
    x = block_runner_ ? block_runner_(block, x) : block->forward(x);
  }
  x = ln_f->forward(x);
  if (lm_head) return lm_head->forward(x);
  return torch::matmul(x, wte->weight.t());
}

std::vector<std::shared_ptr<BlockImpl>> GPTImpl::block_list() const {
  std::vector<std::shared_ptr<BlockImpl>> list;
  for (size_t i = 0; i < blocks->size(); ++i) list.push_back(blocks->ptr<BlockImpl>(i));
  return list;
}

torch::Tensor GPTImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto logits = forward(idx);
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

}  // namespace gpt

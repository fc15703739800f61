#include "fsdp/tiny_transformer.h"

#include <cmath>

#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/full_params.h"

namespace tdist::fsdp::testing {

TinyBlockImpl::TinyBlockImpl(const TinyConfig& c) : config(c) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  // No qkv bias: softmax is invariant to the key bias, so its gradient is pure rounding noise
  // that Adam would amplify to +-lr per step, differently in any two summation orders.
  qkv = register_module(
      "qkv", torch::nn::Linear(torch::nn::LinearOptions(c.width, 3 * c.width).bias(false)));
  proj = register_module("proj", torch::nn::Linear(c.width, c.width));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  fc1 = register_module("fc1", torch::nn::Linear(c.width, c.hidden));
  fc2 = register_module("fc2", torch::nn::Linear(c.hidden, c.width));
}

torch::Tensor TinyBlockImpl::forward(torch::Tensor x) {
  const int64_t b = x.size(0), t = x.size(1), w = config.width, h = config.heads;
  auto q_k_v = qkv(ln1(x)).chunk(3, -1);
  auto split = [&](const torch::Tensor& y) { return y.view({b, t, h, w / h}).transpose(1, 2); };
  auto q = split(q_k_v[0]), k = split(q_k_v[1]), v = split(q_k_v[2]);
  auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(w / h));
  auto mask = torch::ones({t, t}, torch::TensorOptions(torch::kBool).device(x.device())).triu(1);
  att = att.masked_fill(mask, -1e9).softmax(-1);
  auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, w});
  x = x + proj(y);
  return x + fc2(torch::gelu(fc1(ln2(x))));
}

TinyTransformerImpl::TinyTransformerImpl(const TinyConfig& c) : config(c) {
  tok = register_module("tok", torch::nn::Embedding(c.vocab, c.width));
  pos = register_parameter("pos", torch::randn({c.seq, c.width}) * 0.1);
  for (int64_t i = 0; i < c.blocks; ++i) {
    blocks.push_back(register_module("block" + std::to_string(i), TinyBlock(c)));
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  head = register_module("head", torch::nn::Linear(c.width, c.vocab));
}

torch::Tensor TinyTransformerImpl::forward(torch::Tensor idx) {
  auto x = tok(idx) + pos.narrow(0, 0, idx.size(1));
  for (auto& block : blocks) {
    x = tdist::fsdp::forward(block, x);  // was: x = block(x)
    if (config.inplace_output_scale != 0) x.mul_(config.inplace_output_scale);
  }
  return head(ln_f(x));
}

TinyConfig uneven_tiny_config() {
  TinyConfig c;
  c.vocab = 7;
  c.width = 15;
  c.heads = 3;
  c.hidden = 21;
  c.seq = 5;
  return c;
}

TinyTransformer make_tiny(const TinyConfig& c, uint64_t seed) {
  torch::manual_seed(seed);
  return TinyTransformer(c);
}

std::pair<torch::Tensor, torch::Tensor> tiny_batch(const TinyConfig& c, int64_t global_batch,
                                                   int step) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + step));
  auto tokens = torch::randint(c.vocab, {global_batch, c.seq + 1}, gen, torch::kLong);
  return {tokens.narrow(1, 0, c.seq), tokens.narrow(1, 1, c.seq)};
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

std::vector<FSDPModule> tiny_handles(TinyTransformer& model, FSDPModule root) {
  std::vector<FSDPModule> handles;
  for (auto& block : model->blocks) handles.push_back(fsdp_module(*block));
  handles.push_back(std::move(root));
  return handles;
}

namespace {

// The largest |difference| between `model`'s parameters as they are now and `ref`'s.
double max_diff_as_is(TinyTransformer& model, TinyTransformer& ref) {
  auto ref_params = ref->named_parameters();
  double max_diff = 0;
  for (const auto& item : model->named_parameters()) {
    const auto& expected = ref_params[item.key()];
    if (item.value().sizes() != expected.sizes()) {
      throw std::runtime_error("parameter '" + item.key() + "' has shape " +
                               c10::str(item.value().sizes()) + " unsharded, the reference " +
                               c10::str(expected.sizes()));
    }
    max_diff = std::max(max_diff, (item.value() - expected).abs().max().item<double>());
  }
  return max_diff;
}

}  // namespace

double max_param_diff(TinyTransformer& model, std::vector<FSDPModule>& handles,
                      TinyTransformer& ref) {
  for (auto& h : handles) h.unshard();
  const double max_diff = max_diff_as_is(model, ref);
  for (auto& h : handles) h.reshard();
  return max_diff;
}

double max_param_diff(TinyTransformer& model, TinyTransformer& ref) {
  SummonFullParams full(model, SummonFullParamsOptions().writeback(false));
  return max_diff_as_is(model, ref);
}

int64_t param_numel(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

}  // namespace tdist::fsdp::testing

#pragma once

// The GPT the FSDP benchmarks train (until examples/gpt's model is a library): token and
// position embeddings, `depth` pre-norm transformer blocks (causal attention + 4x MLP), a
// final LayerNorm and an output head. Parameters: 12*width^2 + 13*width per block, plus
// 2*vocab*width + seq*width + vocab + 2*width.

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "tdist/fsdp/forward.h"
#ifdef TDIST_BENCH_HAVE_DDP
#include "tdist/ddp/distributed_data_parallel.h"
#endif

namespace bench_fsdp {

inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

struct GPTConfig {
  int width = 256;
  int depth = 4;
  int heads = 4;
  int seq = 64;
  int vocab = 1024;
};

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int w, int h) : heads(h) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({w})));
    qkv = register_module("qkv", torch::nn::Linear(w, 3 * w));
    proj = register_module("proj", torch::nn::Linear(w, w));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({w})));
    fc1 = register_module("fc1", torch::nn::Linear(w, 4 * w));
    fc2 = register_module("fc2", torch::nn::Linear(4 * w, w));
  }
  torch::Tensor forward(torch::Tensor x) {
    const int64_t b = x.size(0), t = x.size(1), w = x.size(2);
    auto parts = qkv(ln1(x)).chunk(3, -1);
    auto split = [&](const torch::Tensor& y) {
      return y.view({b, t, heads, w / heads}).transpose(1, 2);
    };
    auto att = torch::matmul(split(parts[0]), split(parts[1]).transpose(-2, -1)) /
               std::sqrt(static_cast<double>(w / heads));
    // The mask is made where the scores are: a host-side mask would be copied every layer.
    const auto mask = torch::ones({t, t}, att.options().dtype(torch::kBool)).triu(1);
    att = att.masked_fill(mask, -1e9).softmax(-1);
    auto y = torch::matmul(att, split(parts[2])).transpose(1, 2).contiguous().view({b, t, w});
    x = x + proj(y);
    return x + fc2(torch::gelu(fc1(ln2(x))));
  }
  int heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  /// `on_block` runs on each block right after it is built (e.g. fully_shard it, so that a
  /// large model never exists unsharded as a whole).
  explicit GPTImpl(const GPTConfig& c, const std::function<void(Block&)>& on_block = {}) {
    tok = register_module("tok", torch::nn::Embedding(c.vocab, c.width));
    pos = register_parameter("pos", torch::randn({c.seq, c.width}) * 0.02);
    for (int i = 0; i < c.depth; ++i) {
      Block block(c.width, c.heads);
      if (on_block) on_block(block);
      blocks.push_back(register_module("block" + std::to_string(i), block));
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
    head = register_module("head", torch::nn::Linear(c.width, c.vocab));
  }
  torch::Tensor forward(torch::Tensor idx) {
    auto x = tok(idx) + pos;
    for (auto& block : blocks) x = tdist::fsdp::forward(block, x);
    return head(ln_f(x));
  }
  torch::nn::Embedding tok{nullptr};
  torch::Tensor pos;
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(GPT);

#ifdef TDIST_BENCH_HAVE_DDP
using DDP = tdist::ddp::DistributedDataParallel;
#else
struct DDP {};  // a build without tdist_ddp never makes one
#endif

/// One optimizer step of `model` on (x, y): forward through `ddp` when given, else through
/// FSDP's entry point (plain forward for a model that is not sharded); returns the loss.
inline torch::Tensor train_step(GPT& model, DDP* ddp, torch::optim::Optimizer& opt,
                                const torch::Tensor& x, const torch::Tensor& y, int vocab) {
  opt.zero_grad();
  torch::Tensor logits;
#ifdef TDIST_BENCH_HAVE_DDP
  if (ddp) logits = ddp->forward([&] { return model->forward(x); });
#endif
  if (!logits.defined()) logits = tdist::fsdp::forward(model, x);
  auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), y.reshape({-1}));
  loss.backward();
  opt.step();
  return loss;
}

}  // namespace bench_fsdp

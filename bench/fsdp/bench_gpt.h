#pragma once

// The model the FSDP benchmarks train: GPT-2 (tdist::models' gpt2 family, transformers'
// GPT2LMHeadModel, the trainer's model), in the shape the benchmark's environment asks for,
// with dropout off so that every mode computes the same thing. Parameters: 12*width^2 +
// 13*width per block, plus vocab*width (tied head) + seq*width + 2*width.

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "tdist/fsdp/deferred_init.h"
#include "tdist/fsdp/forward.h"
#include "tdist/models/causal_lm.h"
#include "tdist/models/config.h"
#include "tdist/models/pretrained.h"
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

  /// GPT-2's config.json for this shape, read as the trainer reads one (GPT-2's defaults for
  /// everything else: gelu_new, LayerNorm eps 1e-5, tied head), dropout off.
  tdist::models::ModelConfig model() const {
    const nlohmann::json json = {{"model_type", "gpt2"},
                                 {"architectures", {"GPT2LMHeadModel"}},
                                 {"n_embd", width},
                                 {"n_layer", depth},
                                 {"n_head", heads},
                                 {"n_positions", seq},
                                 {"vocab_size", vocab},
                                 {"attn_pdrop", 0.0},
                                 {"embd_pdrop", 0.0},
                                 {"resid_pdrop", 0.0},
                                 {"tie_word_embeddings", true}};
    return tdist::models::ModelConfig::from_json(json.dump(), "the benchmark's GPT-2");
  }
};

using GPT = std::shared_ptr<tdist::models::CausalLM>;

/// The GPT with transformers' initialisation, seeded, so that every mode and rank starts from
/// the same weights: built on the meta device, `shard` applied (fully_shard, or nothing),
/// then materialised, each rank allocating only what it keeps.
inline GPT build_gpt(const GPTConfig& c, const std::function<void(const GPT&)>& shard = {}) {
  const tdist::models::ModelConfig config = c.model();
  GPT model;
  {
    tdist::fsdp::MetaDeviceGuard meta;
    model = tdist::models::build_model(config);
  }
  if (shard) shard(model);
  tdist::fsdp::materialize(model, tdist::fsdp::MaterializeOptions().seed(42).init_fn(
                                      tdist::models::init_weights_fn(config)));
  return model;
}

#ifdef TDIST_BENCH_HAVE_DDP
using DDP = tdist::ddp::DistributedDataParallel<GPT>;
#else
struct DDP {};  // a build without tdist_ddp never makes one
#endif

/// One optimizer step of `model` on (x, y), y being x shifted by one: forward through `ddp`
/// when given, else through FSDP's entry point (plain forward for a model that is not
/// sharded); returns the loss.
inline torch::Tensor train_step(GPT& model, DDP* ddp, torch::optim::Optimizer& opt,
                                const torch::Tensor& x, const torch::Tensor& y, int vocab) {
  opt.zero_grad();
  torch::Tensor logits;
#ifdef TDIST_BENCH_HAVE_DDP
  if (ddp) logits = ddp->forward(x);
#endif
  if (!logits.defined()) logits = tdist::fsdp::forward(model, x);
  auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), y.reshape({-1}));
  loss.backward();
  opt.step();
  return loss;
}

}  // namespace bench_fsdp

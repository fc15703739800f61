#pragma once

// A tiny GPT-style transformer for FSDP tests: token + position embeddings, pre-LN blocks
// (causal self-attention, MLP), final LayerNorm and a vocabulary head. Each block is called
// through tdist::fsdp::forward, which runs a plain forward when the block is not sharded,
// so the same model serves as the single-process reference.

#include <torch/torch.h>

#include "tdist/fsdp/fully_shard.h"

namespace tdist::fsdp::testing {

struct TinyConfig {
  int64_t vocab = 23;
  int64_t width = 16;
  int64_t heads = 2;
  int64_t hidden = 32;
  int64_t seq = 8;
  int64_t blocks = 2;
  // Non-zero: each block's output is scaled in place by this after fsdp::forward (an in-place
  // op on FSDP's boundary output, Note [Boundary aliases]).
  double inplace_output_scale = 0;
};

class TinyBlockImpl : public torch::nn::Module {
 public:
  explicit TinyBlockImpl(const TinyConfig& c);
  torch::Tensor forward(torch::Tensor x);

  TinyConfig config;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TinyBlock);

class TinyTransformerImpl : public torch::nn::Module {
 public:
  explicit TinyTransformerImpl(const TinyConfig& c);
  /// idx: [batch, seq] token ids -> logits [batch, seq, vocab].
  torch::Tensor forward(torch::Tensor idx);

  TinyConfig config;
  torch::nn::Embedding tok{nullptr};
  torch::Tensor pos;
  std::vector<TinyBlock> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TinyTransformer);

/// A model with deterministic weights (same on every process).
TinyTransformer make_tiny(const TinyConfig& c, uint64_t seed = 1234);

/// Shapes that do not divide: tok [7,15] and head [7,15] put 7 rows over 2, 3 or 4 ranks, and
/// every other dimension is odd too.
TinyConfig uneven_tiny_config();

/// The global batch of `step`: `global_batch` rows of (input, target) token ids.
std::pair<torch::Tensor, torch::Tensor> tiny_batch(const TinyConfig& c, int64_t global_batch,
                                                   int step);

/// Mean cross-entropy of next-token prediction.
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

/// The FSDP handles of a model sharded block by block and then at the root.
std::vector<FSDPModule> tiny_handles(TinyTransformer& model, FSDPModule root);

/// The largest |difference| between `model`'s full parameters (read while `handles` are
/// unsharded; resharded after) and the same-named parameters of `ref`. Throws when a shape
/// differs.
double max_param_diff(TinyTransformer& model, std::vector<FSDPModule>& handles,
                      TinyTransformer& ref);
/// The same, reading the full parameters through summon_full_params (in the sharded dtype).
double max_param_diff(TinyTransformer& model, TinyTransformer& ref);

/// Elements of a module's parameters (at rest: this rank's shards when sharded).
int64_t param_numel(const torch::nn::Module& module);

}  // namespace tdist::fsdp::testing

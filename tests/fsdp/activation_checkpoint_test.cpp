// Activation checkpointing (tdist::fsdp::checkpointed_forward) of sharded blocks: training parity
// with the same sharded model without checkpointing; the recompute runs in backward with grad on
// parameters unsharded again; plain (unsharded) modules and RNG state (dropout) too.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "fsdp/tiny_transformer.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/fsdp/activation_checkpoint.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"

namespace tdist::fsdp {
namespace {

using testing::TinyConfig;
using testing::TinyTransformer;

constexpr int kSteps = 8;
constexpr int64_t kLocalBatch = 2;
constexpr double kTol = 1e-5;

using tdist::testing::env_str;

// The tiny transformer with every block checkpointed (same parameters, same names).
class CheckpointedTinyImpl : public testing::TinyTransformerImpl {
 public:
  using testing::TinyTransformerImpl::TinyTransformerImpl;
  torch::Tensor forward(torch::Tensor idx) {
    auto x = tok(idx) + pos.narrow(0, 0, idx.size(1));
    for (auto& block : blocks) x = tdist::fsdp::checkpointed_forward(block, x);
    return head(ln_f(x));
  }
};
TORCH_MODULE(CheckpointedTiny);

template <class M>
std::vector<FSDPModule> shard(M& model, const FullyShardOptions& opts) {
  std::vector<FSDPModule> handles;
  for (auto& block : model->blocks) handles.push_back(fully_shard(block, opts));
  handles.push_back(fully_shard(model, opts));
  return handles;
}

// Env CKPT_RESHARD: "true" / "false" (reshard_after_forward).
TDIST_SCENARIO(ckpt_parity) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank();
  const int world = get_world_size();
  const TinyConfig c;
  const bool reshard = env_str("CKPT_RESHARD", "true") == "true";
  const FullyShardOptions opts = FullyShardOptions().reshard_after_forward(reshard);

  TinyTransformer plain = testing::make_tiny(c);
  torch::manual_seed(1234);  // make_tiny's seed: identical initial parameters
  CheckpointedTiny ckpt(c);
  auto plain_handles = shard(plain, opts);
  auto ckpt_handles = shard(ckpt, opts);
  torch::optim::AdamW plain_opt(plain->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::optim::AdamW ckpt_opt(ckpt->parameters(), torch::optim::AdamWOptions(1e-3));

  for (int step = 0; step < kSteps; ++step) {
    auto [inputs, targets] = testing::tiny_batch(c, kLocalBatch * world, step);
    auto x = inputs.narrow(0, rank * kLocalBatch, kLocalBatch);
    auto y = targets.narrow(0, rank * kLocalBatch, kLocalBatch);
    plain_opt.zero_grad();
    auto plain_loss = testing::lm_loss(tdist::fsdp::forward(plain, x), y);
    plain_loss.backward();
    plain_opt.step();
    ckpt_opt.zero_grad();
    auto ckpt_loss = testing::lm_loss(tdist::fsdp::forward(ckpt, x), y);
    // Checkpointed blocks are resharded after forward as usual: their activations are gone
    // and so are their full parameters; backward must gather them again.
    for (size_t i = 0; i + 1 < ckpt_handles.size(); ++i) {
      EXPECT_EQ(ckpt_handles[i].is_unsharded(), !reshard) << "block " << i;
    }
    ckpt_loss.backward();
    ckpt_opt.step();
    EXPECT_NEAR(ckpt_loss.item<double>(), plain_loss.item<double>(), kTol) << "step " << step;
  }
  // A checkpointed block all-gathers exactly as a plain one: once in forward and, when it
  // resharded after forward, once more in backward, which the recompute uses.
  for (size_t i = 0; i < ckpt_handles.size(); ++i) {
    const int64_t per_step = (reshard && i + 1 < ckpt_handles.size()) ? 2 : 1;
    EXPECT_EQ(ckpt_handles[i].stats().all_gathers, per_step * kSteps) << "module " << i;
    EXPECT_EQ(ckpt_handles[i].stats().all_gathers, plain_handles[i].stats().all_gathers);
    EXPECT_EQ(ckpt_handles[i].stats().reduce_scatters, kSteps);
  }
  for (auto& h : plain_handles) h.unshard();
  for (auto& h : ckpt_handles) h.unshard();
  auto expected = plain->named_parameters();
  double max_diff = 0;
  for (const auto& item : ckpt->named_parameters()) {
    max_diff = std::max(max_diff, (item.value() - expected[item.key()]).abs().max().item<double>());
  }
  for (auto& h : plain_handles) h.reshard();
  for (auto& h : ckpt_handles) h.reshard();
  EXPECT_LE(max_diff, kTol);
  destroy_process_group();
}

TEST(ActivationCheckpoint, ShardedTrainingMatchesUncheckpointed) {
  for (const char* reshard : {"true", "false"}) {
    tdist::testing::ProcessOptions options;
    options.env = {{"CKPT_RESHARD", reshard}};
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("ckpt_parity", 2, options));
  }
}

// ---- the recompute, observed --------------------------------------------------------------

// A block that records, for every call of its forward, whether grad mode was on and whether
// its parameters were unsharded.
class ProbeBlockImpl : public testing::TinyBlockImpl {
 public:
  using testing::TinyBlockImpl::TinyBlockImpl;
  torch::Tensor forward(torch::Tensor x) {
    calls.emplace_back(torch::GradMode::is_enabled(), fsdp_module(*this).is_unsharded());
    return testing::TinyBlockImpl::forward(x);
  }
  std::vector<std::pair<bool, bool>> calls;
};
TORCH_MODULE(ProbeBlock);

class ProbeModelImpl : public torch::nn::Module {
 public:
  explicit ProbeModelImpl(const TinyConfig& c) {
    tok = register_module("tok", torch::nn::Embedding(c.vocab, c.width));
    block = register_module("block", ProbeBlock(c));
    head = register_module("head", torch::nn::Linear(c.width, c.vocab));
  }
  torch::Tensor forward(torch::Tensor idx) {
    return head(tdist::fsdp::checkpointed_forward(block, tok(idx)));
  }
  torch::nn::Embedding tok{nullptr};
  ProbeBlock block{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(ProbeModel);

using Call = std::pair<bool, bool>;  // (grad enabled, unsharded)

TDIST_SCENARIO(ckpt_recompute) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const TinyConfig c;
  ProbeModel model(c);
  FSDPModule block = fully_shard(model->block);
  fully_shard(model);
  auto [x, y] = testing::tiny_batch(c, 2, 0);

  auto loss = testing::lm_loss(tdist::fsdp::forward(model, x), y);
  ASSERT_EQ(model->block->calls.size(), 1u);
  EXPECT_EQ(model->block->calls[0], Call(false, true));  // forward: no_grad, unsharded
  EXPECT_FALSE(block.is_unsharded());                    // resharded after forward
  EXPECT_EQ(block.unsharded_bytes(), 0u);
  EXPECT_EQ(block.stats().all_gathers, 1);

  loss.backward();
  ASSERT_EQ(model->block->calls.size(), 2u);
  EXPECT_EQ(model->block->calls[1], Call(true, true));  // recompute: with grad, unsharded again
  EXPECT_EQ(block.stats().all_gathers, 2);
  EXPECT_EQ(block.stats().reduce_scatters, 1);
  EXPECT_FALSE(block.is_unsharded());
  for (const auto& p : model->block->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().sizes(), p.sizes());  // the sharded gradient
  }

  // Inference: a plain forward, nothing recomputed.
  {
    torch::NoGradGuard no_grad;
    tdist::fsdp::forward(model, x);
  }
  ASSERT_EQ(model->block->calls.size(), 3u);
  EXPECT_EQ(model->block->calls[2], Call(false, true));
  destroy_process_group();
}

TEST(ActivationCheckpoint, RecomputeUnshardsAgain) {
  tdist::testing::expect_all_ok(tdist::testing::run_ranks_as_processes("ckpt_recompute", 2));
}

// ---- without FSDP -------------------------------------------------------------------------

TEST(ActivationCheckpoint, PlainModuleSameGradients) {
  torch::manual_seed(7);
  testing::TinyBlock block(TinyConfig{});
  auto x = torch::randn({2, 8, 16}, torch::requires_grad());
  block->forward(x).pow(2).sum().backward();
  std::vector<at::Tensor> expected;
  for (const auto& p : block->parameters()) expected.push_back(p.grad().clone());
  auto expected_x = x.grad().clone();
  block->zero_grad();
  x.mutable_grad() = at::Tensor();

  auto out = tdist::fsdp::checkpointed_forward(block, x);
  EXPECT_EQ(out.grad_fn()->name().find("CheckpointFunction") != std::string::npos, true)
      << out.grad_fn()->name();
  out.pow(2).sum().backward();
  auto params = block->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i].grad(), expected[i], 1e-6, 1e-7)) << i;
  }
  EXPECT_TRUE(torch::allclose(x.grad(), expected_x, 1e-6, 1e-7));
}

TEST(ActivationCheckpoint, InputsWithoutGradStillReachParameters) {
  torch::nn::Linear lin(4, 3);
  auto x = torch::randn({5, 4});  // requires no grad: only the parameters do
  tdist::fsdp::checkpointed_forward(lin, x).sum().backward();
  ASSERT_TRUE(lin->weight.grad().defined());
  EXPECT_TRUE(torch::allclose(lin->weight.grad(), x.sum(0).expand({3, 4})));
}

TEST(ActivationCheckpoint, RecomputeReplaysRandomness) {
  torch::nn::Dropout dropout(0.5);
  auto x = torch::ones({64}, torch::requires_grad());
  torch::manual_seed(3);
  auto out = tdist::fsdp::checkpointed_forward(dropout, x);
  torch::rand({10});  // the RNG moves on before backward
  out.sum().backward();
  // Same mask in forward and recompute: the gradient is 2 exactly where the output is.
  EXPECT_TRUE(torch::equal(x.grad(), out.detach()));
}

}  // namespace
}  // namespace tdist::fsdp

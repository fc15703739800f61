// FSDP2's shard_placement_fn (Note [Sharding on another dim]): parameters sharded on their
// last dim, with uneven sizes, hold torch.chunk's slices, train like one process, and keep
// their slices through state dicts.
#include <gtest/gtest.h>

#include "fsdp/tiny_transformer.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/state_dict.h"
#include "tdist/optim/adam.h"

// A namespace of its own: the test target is a unity build with the other feature tests.
namespace tdist::fsdp::shard_placement_test {
namespace {

using testing::TinyConfig;
using testing::TinyTransformer;

constexpr int64_t kLocalBatch = 2;
constexpr int kSteps = 4;

/// Matrices on their last dim (Shard(-1)); vectors on dim 0 (nullopt).
std::optional<tensor::Shard> last_dim_of_matrices(const std::string&, const at::Tensor& p) {
  if (p.dim() < 2) return std::nullopt;
  return tensor::Shard(-1);
}

void shard(TinyTransformer& model, ReshardAfterForward reshard) {
  auto options =
      FullyShardOptions().reshard_after_forward(reshard).shard_placement_fn(last_dim_of_matrices);
  for (auto& block : model->blocks) fully_shard(block, options);
  fully_shard(model, options);
}

TDIST_SCENARIO(fsdp_shard_placement) {
  init_process_group();
  const int rank = get_rank(), world = get_world_size();
  TinyConfig c;  // width 16, hidden 32: uneven over 3 ranks
  TinyTransformer ref = testing::make_tiny(c);
  TinyTransformer model = testing::make_tiny(c);
  const std::string reshard = tdist::testing::env_str("SP_RESHARD", "true");
  shard(model, reshard == "2" ? ReshardAfterForward(2) : ReshardAfterForward(reshard == "true"));

  // At rest every matrix is torch.chunk's slice of its last dim for this rank.
  auto ref_params = ref->named_parameters();
  int sharded_on_last_dim = 0;
  for (const auto& item : model->named_parameters()) {
    const at::Tensor& whole = ref_params[item.key()];
    if (whole.dim() < 2) continue;
    ++sharded_on_last_dim;
    auto chunks = whole.chunk(world, -1);
    const at::Tensor want = rank < static_cast<int64_t>(chunks.size())
                                ? chunks[rank]
                                : whole.narrow(-1, whole.size(-1), 0);
    ASSERT_EQ(item.value().sizes(), want.sizes()) << item.key();
    EXPECT_TRUE(item.value().equal(want)) << item.key();
  }
  EXPECT_GT(sharded_on_last_dim, 4);

  torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1e-2));
  // The fused kernel walks parameters and their state as memory: slices along the last dim are
  // not contiguous, and their gradients and state must share their strides.
  tdist::optim::AdamW opt(model->parameters(), tdist::optim::AdamWOptions(1e-2).implementation(
                                                   tdist::optim::Implementation::kFused));
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = testing::tiny_batch(c, kLocalBatch * world, step);
    ref_opt.zero_grad();
    at::Tensor ref_loss = testing::lm_loss(ref->forward(x), y);
    ref_loss.backward();
    ref_opt.step();
    opt.zero_grad();
    at::Tensor loss =
        testing::lm_loss(tdist::fsdp::forward(model, x.narrow(0, rank * kLocalBatch, kLocalBatch)),
                         y.narrow(0, rank * kLocalBatch, kLocalBatch));
    loss.backward();
    opt.step();
    at::Tensor mean = loss.detach().reshape({1}).to(at::kDouble);
    all_reduce(mean);
    EXPECT_NEAR(mean.item<double>() / world, ref_loss.item<double>(), 1e-5) << "step " << step;
  }
  EXPECT_LE(testing::max_param_diff(model, ref), 1e-5);

  // Sharded state dicts carry the slices at their offsets along the last dim; loading one
  // back restores them.
  ShardedStateDict sharded = get_model_state_dict(*model);
  ShardedStateDict saved;
  for (const auto& [name, entry] : sharded) {
    saved[name] = ShardedTensor{entry.local.clone(), entry.global_shape, entry.offsets};
    if (entry.global_shape.size() < 2) continue;
    const int64_t last = static_cast<int64_t>(entry.global_shape.size()) - 1;
    const int64_t rows = (entry.global_shape[last] + world - 1) / world;
    EXPECT_EQ(entry.offsets[last], std::min<int64_t>(rank * rows, entry.global_shape[last]))
        << name;
    EXPECT_EQ(entry.offsets[0], 0) << name;
  }
  const ShardedStateDict full =
      get_model_state_dict(*model, StateDictOptions().full_state_dict(true));
  ref_params = ref->named_parameters();
  for (const auto& [name, entry] : full) {
    if (ref_params.contains(name)) {
      EXPECT_LE((entry.local - ref_params[name]).abs().max().item<double>(), 1e-5) << name;
    }
  }
  {
    at::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.zero_();
  }
  set_model_state_dict(*model, saved);
  EXPECT_LE(testing::max_param_diff(model, ref), 1e-5);
  // A full state dict loads into the slices too.
  {
    at::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.zero_();
  }
  set_model_state_dict(*model, full, StateDictOptions().full_state_dict(true));
  EXPECT_LE(testing::max_param_diff(model, ref), 1e-5);

  // The optimizer's state follows the parameters' slices.
  ShardedStateDict optim = get_optimizer_state_dict(*model, opt);
  int slices = 0;
  for (const auto& [name, entry] : optim) {
    if (entry.global_shape.size() < 2) continue;
    ++slices;
    const int64_t n = entry.global_shape.back(), rows = (n + world - 1) / world;
    const int64_t offset = std::min<int64_t>(rank * rows, n);
    EXPECT_EQ(entry.local.size(-1), std::min<int64_t>(rows, n - offset)) << name;
  }
  EXPECT_GT(slices, 0);
  destroy_process_group();
}

TDIST_SCENARIO(fsdp_shard_placement_bad_dim) {
  init_process_group();
  TinyConfig c;
  TinyTransformer model = testing::make_tiny(c);
  auto options = FullyShardOptions().shard_placement_fn(
      [](const std::string&, const at::Tensor&) { return std::optional(tensor::Shard(2)); });
  tdist::testing::expect_invalid_argument([&] { fully_shard(model->blocks[0], options); },
                                          "shard_placement_fn returned Shard(2) for parameter");
  destroy_process_group();
}

struct PlacementCase {
  int world;
  std::string reshard;
  const char* name;
};

void PrintTo(const PlacementCase& c, std::ostream* os) {
  *os << c.name;
}

class FSDPShardPlacement : public ::testing::TestWithParam<PlacementCase> {};

TEST_P(FSDPShardPlacement, LastDimSlicesTrainLikeOneProcess) {
  tdist::testing::ProcessOptions options;
  options.env = {{"SP_RESHARD", GetParam().reshard}};
  options.timeout = std::chrono::seconds(240);
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("fsdp_shard_placement", GetParam().world, options));
}

INSTANTIATE_TEST_SUITE_P(Worlds, FSDPShardPlacement,
                         ::testing::Values(PlacementCase{1, "true", "w1"},
                                           PlacementCase{2, "false", "zero2_w2"},
                                           PlacementCase{3, "true", "w3"},
                                           PlacementCase{4, "2", "int2_w4"}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(FSDPShardPlacementBadInput, ADimOutOfRangeIsNamed) {
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("fsdp_shard_placement_bad_dim", 2));
}

}  // namespace
}  // namespace tdist::fsdp::shard_placement_test

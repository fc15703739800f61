// FSDP on the MPI backend, under mpirun (world 2 and 3): fully_shard training of the tiny
// transformer matches single-process training on the concatenated batches every step, with
// reshard_after_forward true and false (same method as tests/fsdp/fsdp_parity_test.cpp).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "fsdp/tiny_transformer.h"
#include "tdist/comm/distributed.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"

namespace tdist::fsdp {
namespace {

using testing::TinyConfig;
using testing::TinyTransformer;

constexpr int kSteps = 8;
constexpr int64_t kLocalBatch = 2;
constexpr double kTol = 1e-5;

class MPIFsdp : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    if (!is_initialized()) {
      init_process_group(
          InitProcessGroupOptions().backend("mpi").timeout(std::chrono::seconds(60)));
    }
  }
};

torch::optim::AdamW make_adamw(TinyTransformer& model) {
  return torch::optim::AdamW(model->parameters(),
                             torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
}

TEST_P(MPIFsdp, FullyShardMatchesSingleProcess) {
  ASSERT_EQ(get_backend(), "mpi");
  const int world = get_world_size();
  const int rank = get_rank();
  const TinyConfig c;
  TinyTransformer ref = testing::make_tiny(c);
  auto ref_opt = make_adamw(ref);
  TinyTransformer model = testing::make_tiny(c);
  FullyShardOptions opts;
  opts.reshard_after_forward(GetParam());
  for (auto& block : model->blocks) fully_shard(block, opts);
  FSDPModule root = fully_shard(model, opts);
  auto opt = make_adamw(model);

  for (int step = 0; step < kSteps; ++step) {
    auto [inputs, targets] = testing::tiny_batch(c, kLocalBatch * world, step);
    ref_opt.zero_grad();
    auto ref_loss = testing::lm_loss(ref->forward(inputs), targets);
    ref_loss.backward();
    ref_opt.step();

    opt.zero_grad();
    auto x = inputs.narrow(0, rank * kLocalBatch, kLocalBatch);
    auto y = targets.narrow(0, rank * kLocalBatch, kLocalBatch);
    auto loss = testing::lm_loss(tdist::fsdp::forward(model, x), y);
    loss.backward();
    opt.step();
    auto global = torch::tensor({loss.item<double>()}, torch::kFloat64);
    all_reduce(global);
    EXPECT_NEAR(global.item<double>() / world, ref_loss.item<double>(), kTol) << "step " << step;
  }

  auto handles = testing::tiny_handles(model, root);
  EXPECT_LE(testing::max_param_diff(model, handles, ref), kTol) << "rank " << rank;
  if (world > 1) {
    EXPECT_LT(testing::param_numel(*model), testing::param_numel(*ref))
        << "parameters are sharded at rest";
  }
}

INSTANTIATE_TEST_SUITE_P(Reshard, MPIFsdp, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "full_shard" : "zero2"; });

}  // namespace
}  // namespace tdist::fsdp

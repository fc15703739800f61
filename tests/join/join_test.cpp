// The Join context manager (SPEC §3): a bare Joinable, the seed's DDP + ZeRO example,
// uneven-input parity, and throw_on_early_termination.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/training_helpers.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/ddp/distributed_data_parallel.h"
#include "tdist/ddp/zero_redundancy_optimizer.h"
#include "tdist/error.h"
#include "tdist/join/join.h"

namespace {

using namespace tdist::testing;
namespace ddp = tdist::ddp;
namespace join = tdist::join;

/// Each iteration all-reduces a 1 (its "training collective"); once joined, its hook
/// all-reduces a 0 instead. The sum seen per iteration counts the ranks still training.
class CountingJoinable : public join::Joinable {
 public:
  class Hook : public join::JoinHook {
   public:
    explicit Hook(CountingJoinable* j) : j_(j) {}
    void main_hook() override {
      at::Tensor zero = torch::zeros({1});
      tdist::all_reduce(zero);
      ++j_->shadowed;
    }
    void post_hook(bool is_last_joiner) override { j_->last_joiner = is_last_joiner; }

   private:
    CountingJoinable* j_;
  };

  void iteration() {
    join::Join::notify_join_context(*this);
    at::Tensor one = torch::ones({1});
    tdist::all_reduce(one);
    totals.push_back(one.item<float>());
  }
  std::unique_ptr<join::JoinHook> join_hook(const join::JoinKwargs&) override {
    return std::make_unique<Hook>(this);
  }
  c10::Device join_device() const override { return c10::kCPU; }
  tdist::ProcessGroupPtr join_process_group() const override { return tdist::group_world(); }

  std::vector<float> totals;
  int shadowed = 0;
  bool last_joiner = false;
};

TDIST_SCENARIO(join_counting) {
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  CountingJoinable j;
  const int mine = 3 + 2 * rank, most = 3 + 2 * (world - 1);
  join::Join(std::vector<join::Joinable*>{&j}).run([&] {
    for (int i = 0; i < mine; ++i) j.iteration();
  });
  ASSERT_EQ(static_cast<int>(j.totals.size()), mine);
  for (int i = 0; i < mine; ++i) {
    int active = 0;
    for (int r = 0; r < world; ++r) active += (i < 3 + 2 * r);
    EXPECT_EQ(j.totals[i], active) << "iteration " << i;
  }
  EXPECT_EQ(j.shadowed, most - mine);
  EXPECT_EQ(j.last_joiner, rank == world - 1);
  EXPECT_FALSE(j.join_config().enable) << "Join must reset the config when it ends";
  tdist::destroy_process_group();
}

/// The seed document's example, ported: DDP(Linear(1, 1)) + ZeRO(Adam), rank r has 10 + r
/// inputs, everything inside Join.
TDIST_SCENARIO(join_seed_example) {
  tdist::init_process_group();
  const int rank = tdist::get_rank();
  torch::manual_seed(rank);
  torch::nn::Linear linear(1, 1);
  ddp::DistributedDataParallel model(linear);
  ddp::ZeroRedundancyOptimizer optim(
      linear->parameters(),
      ddp::optimizer_factory<torch::optim::Adam>(torch::optim::AdamOptions(0.01)));
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < 10 + rank; ++i) inputs.push_back(torch::tensor({1.0f}));
  const auto before = linear->weight.detach().clone();
  join::Join({&model, &optim}).run([&] {
    for (const auto& input : inputs) {
      auto loss = model(input).sum();
      loss.backward();
      optim.step();
    }
  });
  // Every rank reaches this point, with identical parameters that did train.
  EXPECT_EQ(max_diff_across_ranks(linear->parameters()), 0.0);
  EXPECT_GT((linear->weight - before).abs().item<float>(), 0.0f);
  tdist::destroy_process_group();
}

/// Uneven inputs under Join equal single-process training where a finished rank
/// contributes nothing (gradients divided by the initial world size).
/// TDIST_JOIN_OPT: sgd | zero.
TDIST_SCENARIO(join_uneven_parity) {
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  const bool use_zero = env_or("TDIST_JOIN_OPT", "sgd") == "zero";
  std::vector<int> counts;
  for (int r = 0; r < world; ++r) counts.push_back(6 + 3 * ((r + 1) % world));  // uneven
  const auto data = make_batches(counts);

  Mlp model = make_mlp(rank);
  ddp::DistributedDataParallel net(model);
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::unique_ptr<ddp::ZeroRedundancyOptimizer> zero;
  if (use_zero) {
    zero = std::make_unique<ddp::ZeroRedundancyOptimizer>(
        model->parameters(),
        ddp::optimizer_factory<torch::optim::Adam>(torch::optim::AdamOptions(0.01)));
  } else {
    opt = std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  }
  std::vector<join::Joinable*> joinables{&net};
  if (zero) joinables.push_back(zero.get());
  join::Join(joinables).run([&] {
    for (const auto& batch : data.of_rank[rank]) {
      if (zero) {
        zero->zero_grad();
      } else {
        opt->zero_grad();
      }
      loss_of(net, batch).backward();
      if (zero) {
        zero->step();
      } else {
        opt->step();
      }
    }
  });

  Mlp reference = make_mlp(0);
  std::unique_ptr<torch::optim::Optimizer> ref_opt;
  if (use_zero) {
    ref_opt = std::make_unique<torch::optim::Adam>(reference->parameters(),
                                                   torch::optim::AdamOptions(0.01));
  } else {
    ref_opt =
        std::make_unique<torch::optim::SGD>(reference->parameters(), torch::optim::SGDOptions(0.1));
  }
  train_reference(reference, *ref_opt, data, world);
  EXPECT_LE(max_abs_diff(model->parameters(), reference->parameters()), 1e-5) << "rank " << rank;
  EXPECT_EQ(max_diff_across_ranks(model->parameters()), 0.0);
  tdist::destroy_process_group();
}

/// With throw_on_early_termination every rank raises once one runs out.
TDIST_SCENARIO(join_throw_early) {
  tdist::init_process_group();
  const int rank = tdist::get_rank();
  Mlp model = make_mlp(rank);
  ddp::DistributedDataParallel net(model);
  torch::optim::SGD opt(model->parameters(), 0.1);
  const auto data = make_batches(std::vector<int>(tdist::get_world_size(), 8));
  const int mine = 3 + rank;
  int done = 0;
  bool raised = false;
  try {
    join::Join({&net}, /*enable=*/true, /*throw_on_early_termination=*/true).run([&] {
      for (int i = 0; i < mine; ++i) {
        loss_of(net, data.of_rank[rank][i]).backward();
        opt.step();
        ++done;
      }
    });
  } catch (const tdist::Error& e) {
    raised = true;
    EXPECT_NE(std::string(e.what()).find("exhausted"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(raised) << "rank " << rank << " did not raise";
  EXPECT_EQ(done, 3) << "every rank stops at the iteration where rank 0 ran out";
  tdist::destroy_process_group();
}

/// enable=false: the manager is a no-op (even inputs), notify_join_context returns null.
TDIST_SCENARIO(join_disabled) {
  tdist::init_process_group();
  CountingJoinable j;
  join::Join join({&j}, /*enable=*/false);
  EXPECT_EQ(join::Join::notify_join_context(j), nullptr);
  join.run([&] {
    for (int i = 0; i < 3; ++i) j.iteration();
  });
  EXPECT_EQ(j.shadowed, 0);
  tdist::destroy_process_group();
}

void run(const std::string& scenario, int world, std::map<std::string, std::string> env = {}) {
  ProcessOptions options;
  options.env = std::move(env);
  options.timeout = std::chrono::seconds(90);
  expect_all_ok(run_ranks_as_processes(scenario, world, options));
}

TEST(Join, CountsNonJoinedRanks) {
  for (int world : {1, 2, 3, 4}) run("join_counting", world);
}
TEST(Join, SeedExampleDdpZeroUnevenInputs) {
  run("join_seed_example", 2);
}
TEST(Join, UnevenParitySgd) {
  for (int world : {2, 3, 4}) run("join_uneven_parity", world);
}
TEST(Join, UnevenParityZero) {
  for (int world : {2, 3, 4}) run("join_uneven_parity", world, {{"TDIST_JOIN_OPT", "zero"}});
}
TEST(Join, ThrowOnEarlyTerminationRaisesEverywhere) {
  run("join_throw_early", 2);
  run("join_throw_early", 3);
}
TEST(Join, DisabledIsANoOp) {
  run("join_disabled", 2);
}

TEST(Join, RejectsEmptyJoinables) {
  EXPECT_THROW(join::Join(std::vector<join::Joinable*>{}), tdist::InvalidArgument);
}

}  // namespace

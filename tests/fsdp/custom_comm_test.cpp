// FSDP2's set_custom_all_gather / set_custom_reduce_scatter (Note [Custom collectives]):
// collectives run by other algorithms through the custom comms train like FSDP's own, every
// collective goes through them, and a comm that allocates the wrong buffer is named.
#include <gtest/gtest.h>

#include <atomic>

#include "fsdp/tiny_transformer.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/fsdp/custom_comm.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/full_params.h"
#include "tdist/fsdp/fully_shard.h"

// A namespace of its own: the test target is a unity build with the other feature tests.
namespace tdist::fsdp::custom_comm_test {
namespace {

using testing::TinyConfig;
using testing::TinyTransformer;

constexpr int64_t kLocalBatch = 2;
constexpr int kSteps = 3;

/// An all-gather by another algorithm: the list form into the output's rank blocks.
struct ListAllGather : AllGather {
  int calls = 0;
  int allocations = 0;
  at::Tensor allocate(c10::IntArrayRef size, c10::ScalarType dtype, c10::Device device) override {
    ++allocations;
    return Comm::allocate(size, dtype, device);
  }
  WorkPtr operator()(const at::Tensor& output, const at::Tensor& input,
                     const ProcessGroupPtr& group, bool async_op) override {
    ++calls;
    EXPECT_TRUE(async_op);
    std::vector<at::Tensor> blocks = output.chunk(group->size());
    // The input is the output's own block (in place): gather a copy of it.
    return all_gather(blocks, input.clone(), group, async_op);
  }
};

/// A reduce-scatter by another algorithm: an all-reduce, then this rank's block; synchronous
/// (returns no Work).
struct AllReduceScatter : ReduceScatter {
  int calls = 0;
  WorkPtr operator()(const at::Tensor& output, const at::Tensor& input,
                     const ProcessGroupPtr& group, ReduceOp op, bool) override {
    ++calls;
    at::Tensor sum = input.clone();
    all_reduce(sum, op, group);
    output.copy_(sum.view({group->size(), -1}).select(0, group->rank()));
    return nullptr;
  }
};

/// Allocates one element too many.
struct WrongSizeAllGather : ListAllGather {
  at::Tensor allocate(c10::IntArrayRef size, c10::ScalarType dtype, c10::Device device) override {
    return Comm::allocate({size[0] + 1}, dtype, device);
  }
};

std::vector<FSDPModule> shard(TinyTransformer& model, ReshardAfterForward reshard) {
  std::vector<FSDPModule> handles;
  auto options = FullyShardOptions().reshard_after_forward(reshard);
  for (auto& block : model->blocks) handles.push_back(fully_shard(block, options));
  handles.push_back(fully_shard(model, options));
  return handles;
}

ReshardAfterForward reshard_from_env() {
  const std::string value = tdist::testing::env_str("CC_RESHARD", "true");
  if (value == "2") return ReshardAfterForward(2);
  return ReshardAfterForward(value == "true");
}

TDIST_SCENARIO(fsdp_custom_comms) {
  init_process_group();
  const int rank = get_rank(), world = get_world_size();
  TinyConfig c;
  TinyTransformer own = testing::make_tiny(c);
  TinyTransformer custom = testing::make_tiny(c);
  shard(own, reshard_from_env());
  std::vector<FSDPModule> handles = shard(custom, reshard_from_env());
  auto gather = std::make_shared<ListAllGather>();
  auto reduce = std::make_shared<AllReduceScatter>();
  torch::optim::AdamW own_opt(own->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW custom_opt(custom->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    // From the second step: a group that already trained on FSDP's own buffers moves over.
    if (step == 1) {
      for (FSDPModule& h : handles) {
        h.set_custom_all_gather(gather);
        h.set_custom_reduce_scatter(reduce);
      }
    }
    auto [x, y] = testing::tiny_batch(c, kLocalBatch * world, step);
    at::Tensor lx = x.narrow(0, rank * kLocalBatch, kLocalBatch);
    at::Tensor ly = y.narrow(0, rank * kLocalBatch, kLocalBatch);
    double losses[2];
    int i = 0;
    for (auto [model, opt] : {std::pair{&own, &own_opt}, std::pair{&custom, &custom_opt}}) {
      opt->zero_grad();
      at::Tensor loss = testing::lm_loss(tdist::fsdp::forward(*model, lx), ly);
      loss.backward();
      opt->step();
      losses[i++] = loss.item<double>();
    }
    EXPECT_NEAR(losses[1], losses[0], 1e-6) << "step " << step;
  }
  // Every group reduces once per step, through the comm; every gather went through it too.
  EXPECT_EQ(reduce->calls, (kSteps - 1) * static_cast<int>(handles.size()));
  EXPECT_GE(gather->calls, (kSteps - 1) * static_cast<int>(handles.size()));
  EXPECT_EQ(gather->allocations, gather->calls);
  {
    SummonFullParams full_own(own, SummonFullParamsOptions().writeback(false));
    SummonFullParams full_custom(custom, SummonFullParamsOptions().writeback(false));
    auto own_params = own->parameters();
    auto custom_params = custom->parameters();
    for (size_t p = 0; p < own_params.size(); ++p) {
      EXPECT_LE((own_params[p] - custom_params[p]).abs().max().item<double>(), 1e-6);
    }
  }

  // Not while the parameters are gathered.
  handles.front().unshard();
  EXPECT_NE(tdist::testing::error_of([&] {
              handles.front().set_custom_all_gather(nullptr);
            }).find("set_custom_all_gather"),
            std::string::npos);
  handles.front().reshard();

  // A comm that allocates the wrong buffer is named on every rank before any collective.
  for (FSDPModule& h : handles) h.set_custom_all_gather(std::make_shared<WrongSizeAllGather>());
  auto [x, y] = testing::tiny_batch(c, kLocalBatch * world, 0);
  tdist::testing::expect_invalid_argument(
      [&] { tdist::fsdp::forward(custom, x.narrow(0, rank * kLocalBatch, kLocalBatch)); },
      "the custom all-gather of");
  destroy_process_group();
}

struct CommCase {
  int world;
  std::string reshard;
  const char* name;
};

void PrintTo(const CommCase& c, std::ostream* os) {
  *os << c.name;
}

class FSDPCustomComms : public ::testing::TestWithParam<CommCase> {};

TEST_P(FSDPCustomComms, TrainLikeFSDPsOwnAndCarryEveryCollective) {
  tdist::testing::ProcessOptions options;
  options.env = {{"CC_RESHARD", GetParam().reshard}};
  options.timeout = std::chrono::seconds(240);
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("fsdp_custom_comms", GetParam().world, options));
}

INSTANTIATE_TEST_SUITE_P(Worlds, FSDPCustomComms,
                         ::testing::Values(CommCase{1, "true", "w1"},
                                           CommCase{2, "false", "zero2_w2"},
                                           CommCase{3, "true", "w3"}, CommCase{4, "2", "int2_w4"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tdist::fsdp::custom_comm_test

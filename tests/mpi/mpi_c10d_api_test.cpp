// torch.distributed's newer c10d calls on the MPI backend, under mpirun at world sizes 1-4:
// recv from any source (MPI_ANY_SOURCE), PREMUL_SUM by scaling, all_gather_coalesced,
// group_src/group_dst forms, split_group and shrink_group of a subgroup, get_backend_config.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <numeric>
#include <set>

#include "support/expect.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/split_group.h"

namespace {

using tdist::testing::expect_invalid_argument;

class MPIC10dApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!tdist::is_initialized()) {
      tdist::init_process_group(
          tdist::InitProcessGroupOptions().backend("mpi").timeout(std::chrono::seconds(60)));
    }
  }
};

TEST_F(MPIC10dApi, RecvFromAnySourceNamesEachSender) {
  const int world = tdist::get_world_size(), rank = tdist::get_rank();
  at::Tensor t = torch::zeros({4});
  if (world == 1) {
    expect_invalid_argument([&] { tdist::recv(t); }, "in a group of one rank");
    return;
  }
  if (rank != 0) {
    tdist::send(torch::full({4}, 100.0f + rank), 0, nullptr, 3);
  } else {
    std::set<int> senders;
    for (int k = 1; k < world; ++k) {
      const int from = tdist::recv(t, std::nullopt, nullptr, 3);
      EXPECT_TRUE(t.equal(torch::full({4}, 100.0f + from))) << from << ": " << t;
      senders.insert(from);
    }
    EXPECT_EQ(static_cast<int>(senders.size()), world - 1);
    EXPECT_EQ(*senders.begin(), 1);
  }
  if (rank == world - 1) tdist::send(torch::full({4}, 5.0f), std::nullopt, nullptr, 4, 0);
  if (rank == 0) {
    tdist::WorkPtr work = tdist::irecv(t, std::nullopt, nullptr, 4);
    work->wait();
    EXPECT_EQ(work->source_rank(), world - 1);
    EXPECT_TRUE(t.equal(torch::full({4}, 5.0f))) << t;
  }
  tdist::barrier();
}

TEST_F(MPIC10dApi, PremulSumScalesThenSums) {
  const int world = tdist::get_world_size(), rank = tdist::get_rank();
  auto input = [](int r) { return torch::arange(6, torch::kDouble) + r + 1; };
  at::Tensor want = torch::zeros({6}, torch::kDouble);
  for (int r = 0; r < world; ++r) want += 0.5 * input(r);
  for (const auto& op :
       {tdist::make_nccl_premul_sum(0.5), tdist::make_nccl_premul_sum(torch::full({1}, 0.5))}) {
    at::Tensor t = input(rank);
    tdist::all_reduce(t, op);
    EXPECT_TRUE(t.equal(want)) << t;
    t = input(rank);
    tdist::reduce(t, std::nullopt, op, nullptr, false, world - 1);
    EXPECT_TRUE(t.equal(rank == world - 1 ? want : input(rank))) << t;
    at::Tensor in = torch::arange(2 * world, torch::kDouble) + rank, out = torch::zeros({2});
    out = out.to(torch::kDouble);
    tdist::reduce_scatter_tensor(out, in, op);
    at::Tensor full = torch::zeros({2 * world}, torch::kDouble);
    for (int r = 0; r < world; ++r) full += 0.5 * (torch::arange(2 * world, torch::kDouble) + r);
    EXPECT_TRUE(out.equal(full.narrow(0, 2 * rank, 2))) << out;
  }
  at::Tensor ints = torch::ones({2}, torch::kInt);
  expect_invalid_argument([&] { tdist::all_reduce(ints, tdist::make_nccl_premul_sum(2.0)); },
                          "PREMUL_SUM is defined for float16, bfloat16, float32 and float64");
}

TEST_F(MPIC10dApi, AllGatherCoalesced) {
  const int world = tdist::get_world_size(), rank = tdist::get_rank();
  auto inputs_of = [](int r) {
    return std::vector<at::Tensor>{torch::full({2, 3}, r + 1.0f), torch::full({1}, 10.0f * r)};
  };
  std::vector<std::vector<at::Tensor>> outputs(world);
  for (auto& list : outputs) list = {torch::empty({2, 3}), torch::empty({1})};
  tdist::all_gather_coalesced(outputs, inputs_of(rank));
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(outputs[r][0].equal(inputs_of(r)[0])) << r;
    EXPECT_TRUE(outputs[r][1].equal(inputs_of(r)[1])) << r;
  }
}

TEST_F(MPIC10dApi, GroupRankFormsAndBackendConfig) {
  const int world = tdist::get_world_size(), rank = tdist::get_rank();
  EXPECT_EQ(tdist::get_backend_config(), "cpu:mpi");
  at::Tensor t = torch::full({2}, static_cast<float>(rank));
  tdist::broadcast(t, std::nullopt, nullptr, false, world - 1);
  EXPECT_EQ(t[0].item<float>(), static_cast<float>(world - 1));
  expect_invalid_argument([&] { tdist::broadcast(t, 0, nullptr, false, 0); },
                          "both src (0) and group_src (0)");
}

TEST_F(MPIC10dApi, SplitAndShrinkASubgroup) {
  const int world = tdist::get_world_size(), rank = tdist::get_rank();
  std::vector<int> evens, odds;
  for (int r = 0; r < world; ++r) (r % 2 ? odds : evens).push_back(r);
  const tdist::ProcessGroupPtr mine =
      tdist::split_group(nullptr, odds.empty() ? std::vector<std::vector<int>>{evens}
                                               : std::vector<std::vector<int>>{evens, odds});
  ASSERT_NE(mine, nullptr);
  const std::vector<int>& expected = rank % 2 ? odds : evens;
  EXPECT_EQ(tdist::get_process_group_ranks(mine), expected);
  at::Tensor t = torch::full({1}, static_cast<float>(rank));
  tdist::all_reduce(t, tdist::ReduceOp::SUM, mine);
  EXPECT_EQ(t.item<float>(),
            static_cast<float>(std::accumulate(expected.begin(), expected.end(), 0)));
  if (world > 1) {
    std::vector<int> everyone(world);
    std::iota(everyone.begin(), everyone.end(), 0);
    const tdist::ProcessGroupPtr g = tdist::new_group(everyone);
    if (rank != world - 1) {
      const tdist::ProcessGroupPtr shrunk = tdist::shrink_group({world - 1}, g);
      EXPECT_EQ(tdist::get_world_size(shrunk), world - 1);
      at::Tensor s = torch::full({1}, 1.0f);
      tdist::all_reduce(s, tdist::ReduceOp::SUM, shrunk);
      EXPECT_EQ(s.item<float>(), static_cast<float>(world - 1));
    }
  }
  tdist::barrier();
}

}  // namespace

// The MPI backend through the public front end, under mpirun: init_process_group("mpi")
// with no MASTER_ADDR/RANK (the launch bootstrap), groups, object-free collectives, and DDP
// parity against single-process training.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "tdist/comm/distributed.h"
#include "tdist/ddp/distributed_data_parallel.h"

namespace {

class MPIProcessGroup : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!tdist::is_initialized()) {
      tdist::init_process_group(
          tdist::InitProcessGroupOptions().backend("mpi").timeout(std::chrono::seconds(60)));
    }
  }
};

TEST_F(MPIProcessGroup, InitFromMpirunEnvironment) {
  EXPECT_TRUE(tdist::is_mpi_available());
  EXPECT_EQ(tdist::get_backend(), "mpi");
  const int world = tdist::get_world_size();
  EXPECT_GE(world, 1);
  auto t = torch::full({3}, static_cast<float>(tdist::get_rank()));
  tdist::all_reduce(t);
  EXPECT_EQ(t[0].item<float>(), world * (world - 1) / 2.0f);
}

TEST_F(MPIProcessGroup, SubgroupOfEvenRanks) {
  const int world = tdist::get_world_size(), rank = tdist::get_rank();
  std::vector<int> evens;
  for (int r = 0; r < world; r += 2) evens.push_back(r);
  auto group = tdist::new_group(evens);
  auto t = torch::full({2}, static_cast<float>(rank + 1));
  tdist::all_reduce(t, tdist::ReduceOp::SUM, group);
  if (rank % 2 == 0) {
    float expected = 0;
    for (int r : evens) expected += r + 1;
    EXPECT_EQ(t[0].item<float>(), expected);
    EXPECT_EQ(tdist::get_group_rank(group, rank), rank / 2);
  } else {
    EXPECT_EQ(t[0].item<float>(), rank + 1);  // a non-member's tensor is left alone
  }
  tdist::barrier();
}

TEST_F(MPIProcessGroup, ReduceScatterTensorThroughFrontEnd) {
  const int world = tdist::get_world_size(), rank = tdist::get_rank();
  auto input = torch::arange(4 * world, torch::kFloat) + rank;
  auto output = torch::empty({4});
  tdist::reduce_scatter_tensor(output, input);
  auto expected = (torch::arange(4 * world, torch::kFloat) * world + world * (world - 1) / 2)
                      .narrow(0, 4 * rank, 4);
  EXPECT_TRUE(output.equal(expected)) << output;
}

torch::nn::Sequential make_model() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
}

TEST_F(MPIProcessGroup, DdpMatchesSingleProcessTraining) {
  const int world = tdist::get_world_size(), rank = tdist::get_rank();
  const int per_rank = 4, steps = 10;
  auto data_for_step = [&](int step) {
    torch::manual_seed(1000 + step);
    return std::make_pair(torch::randn({per_rank * world, 6}), torch::randn({per_rank * world, 3}));
  };
  // Reference: one process, the concatenated batch.
  auto reference = make_model();
  torch::optim::SGD ref_opt(reference->parameters(), 0.1);
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = data_for_step(step);
    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    ref_opt.step();
  }
  // DDP: each rank its slice of the same batches.
  auto model = make_model();
  tdist::ddp::DistributedDataParallel ddp(model);
  torch::optim::SGD opt(model->parameters(), 0.1);
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = data_for_step(step);
    auto xs = x.narrow(0, rank * per_rank, per_rank), ys = y.narrow(0, rank * per_rank, per_rank);
    opt.zero_grad();
    auto out = ddp.forward(xs);
    torch::mse_loss(out, ys).backward();
    opt.step();
  }
  auto ref_params = reference->parameters();
  auto params = model->parameters();
  ASSERT_EQ(ref_params.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LE((params[i] - ref_params[i]).abs().max().item<double>(), 1e-5) << "param " << i;
  }
}

}  // namespace

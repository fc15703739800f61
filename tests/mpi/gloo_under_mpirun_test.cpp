// A Gloo job started by mpirun with nothing else: init_process_group() reads the rank, the
// world and the node-local rank from OpenMPI's variables, puts rank 0's store on this host
// (every rank is local) at a port derived from the MPI job id, and the collectives work
// (Note [Launch environment precedence]).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include "tdist/comm/distributed.h"
#include "tdist/comm/launch_environment.h"

namespace {

TEST(GlooUnderMpirun, InitWithNoFlags) {
  ASSERT_EQ(std::getenv("RANK"), nullptr) << "run under mpirun alone";
  ASSERT_NE(std::getenv("OMPI_COMM_WORLD_RANK"), nullptr) << "run under OpenMPI's mpirun";
  const tdist::LaunchEnvironment launch = tdist::LaunchEnvironment::detect();
  EXPECT_EQ(launch.launcher, "openmpi") << launch.describe();
  tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo"));
  EXPECT_EQ(tdist::get_backend(), "gloo");
  EXPECT_EQ(tdist::get_rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  EXPECT_EQ(tdist::get_world_size(), std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")));
  EXPECT_EQ(tdist::get_node_local_rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")));
  const int world = tdist::get_world_size();
  auto t = torch::full({3}, static_cast<float>(tdist::get_rank() + 1));
  tdist::all_reduce(t);
  EXPECT_EQ(t[0].item<float>(), world * (world + 1) / 2.0f);
  tdist::destroy_process_group();
}

}  // namespace

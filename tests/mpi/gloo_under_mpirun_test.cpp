// A Gloo job started by an MPI launcher with nothing else (no MASTER_ADDR, MASTER_PORT or
// RANK): OpenMPI's mpirun or MPICH's Hydra mpiexec. init_process_group() reads the rank, the
// world and the node-local rank from the launcher's variables, puts rank 0's store on this
// host (every rank is local) at a port derived from what the ranks share (OpenMPI's job id,
// the process id of Hydra's proxy), and the collectives work (Note [Launch environment
// precedence]). The binary is not linked against either MPI: only the environment counts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include "tdist/comm/distributed.h"
#include "tdist/comm/launch_environment.h"

namespace {

struct MpiVariables {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
};

const MpiVariables kOpenMpi{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK"};
const MpiVariables kMpich{"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"};

int number(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : -1;
}

TEST(GlooUnderMpirun, InitWithNoFlags) {
  ASSERT_EQ(std::getenv("RANK"), nullptr) << "run under mpirun alone";
  ASSERT_EQ(std::getenv("MASTER_PORT"), nullptr) << "run under mpirun alone";
  const bool openmpi = std::getenv(kOpenMpi.rank) != nullptr;
  ASSERT_TRUE(openmpi || std::getenv(kMpich.rank) != nullptr)
      << "run under OpenMPI's mpirun or MPICH's mpiexec";
  const MpiVariables& mpi = openmpi ? kOpenMpi : kMpich;
  const tdist::LaunchEnvironment launch = tdist::LaunchEnvironment::detect();
  EXPECT_EQ(launch.launcher, mpi.launcher) << launch.describe();
  EXPECT_GT(launch.master_port, 0) << launch.describe();
  tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo"));
  EXPECT_EQ(tdist::get_backend(), "gloo");
  EXPECT_EQ(tdist::get_rank(), number(mpi.rank));
  EXPECT_EQ(tdist::get_world_size(), number(mpi.size));
  EXPECT_EQ(tdist::get_node_local_rank(), number(mpi.local_rank));
  const int world = tdist::get_world_size();
  auto t = torch::full({3}, static_cast<float>(tdist::get_rank() + 1));
  tdist::all_reduce(t);
  EXPECT_EQ(t[0].item<float>(), world * (world + 1) / 2.0f);
  tdist::destroy_process_group();
}

}  // namespace

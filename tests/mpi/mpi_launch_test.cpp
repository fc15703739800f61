// init_process_group("mpi") in processes that mpirun did not start (as tdistrun starts them:
// MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE only): every rank gets a clear error naming the
// fixes (tdistrun --launcher mpirun, or mpirun) instead of a hang or an MPI abort (Note [MPI under
// tdistrun] in src/mpi/registration.cpp).

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mpi/mpi_environment.h"
#include "support/ranks.h"
#include "support/scoped_env.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/mpi/mpi_backend.h"

namespace tdist::testing {
namespace {

TDIST_SCENARIO(mpi_without_mpirun) {
  try {
    init_process_group(InitProcessGroupOptions().backend("mpi"));
  } catch (const InvalidArgument& e) {
    std::cout << "ERROR: " << e.what() << std::endl;
    return;
  }
  std::cout << "init_process_group(mpi) did not raise" << std::endl;
  std::exit(3);
}

TEST(MpiLaunch, PlainProcessesGetAnErrorThatNamesMpirun) {
  for (int world : {2, 3}) {
    auto results = run_ranks_as_processes("mpi_without_mpirun", world);
    expect_all_ok(results);
    for (const auto& r : results) {
      EXPECT_NE(r.output.find("not started by mpirun"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("mpirun -n " + std::to_string(world)), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("rank " + std::to_string(r.rank)), std::string::npos) << r.output;
      // The fix under tdistrun: its mpirun launcher.
      EXPECT_NE(
          r.output.find("tdistrun --launcher mpirun --nproc-per-node " + std::to_string(world)),
          std::string::npos)
          << r.output;
    }
  }
}

TEST(MpiLaunch, CheckPassesUnderMpirunOrAtWorldOne) {
  EXPECT_NO_THROW(mpi::check_mpi_launch(0, 1));
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_NO_THROW(mpi::check_mpi_launch(1, 2));
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  if (!mpi::launched_by_mpirun()) {
    EXPECT_THROW(mpi::check_mpi_launch(1, 2), InvalidArgument);
  }
}

// The backend's variables are parsed together (MPIEnvironment): unset ones keep the
// defaults, set ones are taken, and a malformed one raises naming the variable and value.
TEST(MpiEnvironment, ParsesEveryVariableAndRefusesMalformedValues) {
  using mpi::detail::MPIEnvironment;
  const char* names[] = {"TDIST_MPI_SHM",
                         "TDIST_MPI_SHM_MIN_BYTES",
                         "TDIST_MPI_SHM_MAX_BYTES",
                         "TDIST_MPI_SHM_PIECE_BYTES",
                         "TDIST_MPI_SHM_INLINE",
                         "TDIST_MPI_SHM_CMA",
                         "TDIST_MPI_SHM_CMA_MIN_BYTES",
                         "TDIST_MPI_SHM_CMA_MAX_BYTES",
                         "TDIST_MPI_DIRECT_MIN_BYTES"};
  std::vector<std::unique_ptr<ScopedEnv>> unset;
  for (const char* name : names) unset.push_back(std::make_unique<ScopedEnv>(name, nullptr));
  const MPIEnvironment defaults = MPIEnvironment::from_env();
  EXPECT_TRUE(defaults.shared_memory);
  EXPECT_EQ(defaults.piece_bytes, int64_t(256) << 10);
  EXPECT_EQ(defaults.direct_min_bytes, int64_t(64) << 10);
  EXPECT_EQ(defaults.peer_read_max_bytes, int64_t(16) << 20);
  {
    ScopedEnv shm("TDIST_MPI_SHM", "0");
    ScopedEnv piece("TDIST_MPI_SHM_PIECE_BYTES", "5000");  // rounded up to 4 KiB
    ScopedEnv direct("TDIST_MPI_DIRECT_MIN_BYTES", "-1");
    ScopedEnv cma("TDIST_MPI_SHM_CMA", "0");
    const MPIEnvironment set = MPIEnvironment::from_env();
    EXPECT_FALSE(set.shared_memory);
    EXPECT_EQ(set.piece_bytes, 8192);
    EXPECT_EQ(set.direct_min_bytes, -1);
    EXPECT_FALSE(set.peer_reads);
  }
  const std::pair<const char*, const char*> malformed[] = {{"TDIST_MPI_SHM", "yes"},
                                                           {"TDIST_MPI_SHM_MAX_BYTES", "16M"},
                                                           {"TDIST_MPI_DIRECT_MIN_BYTES", "-2"}};
  for (const auto& [name, value] : malformed) {
    expect_env_value_rejected(name, value, [] { MPIEnvironment::from_env(); });
  }
}

}  // namespace
}  // namespace tdist::testing

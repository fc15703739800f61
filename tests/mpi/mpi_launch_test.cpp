// init_process_group("mpi") in processes that mpirun did not start (as tdistrun starts them:
// MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE only): every rank gets a clear error naming the
// fixes (tdistrun --launcher mpirun, or mpirun) instead of a hang or an MPI abort (Note [MPI under
// tdistrun] in src/mpi/registration.cpp).

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "support/ranks.h"
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

}  // namespace
}  // namespace tdist::testing

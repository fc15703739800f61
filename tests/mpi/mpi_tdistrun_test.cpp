// The MPI backend under the real tdistrun binary with --launcher mpirun: the workers are
// started by one mpirun (Note [Workers through mpirun] in src/launch/mpirun_launch.h), get
// the torchrun environment, form one MPI world, and a failing worker is summarised and
// restarted like a forked one. The workers are this test binary, re-run as a scenario.

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "launch/run_process.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/mpi/mpi_backend.h"

namespace tdist::testing {
namespace {

using launch::testing::describe;
using launch::testing::lines_with;
using launch::testing::ProcResult;
using launch::testing::run;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

// A tiny training-step stand-in: init_process_group("mpi"), all_reduce and
// reduce_scatter_tensor, each result checked. MPI_TEST_FAIL_RANK exits with code 3 on the
// attempts before MPI_TEST_FAIL_UNTIL_RESTART (all attempts when it is unset).
TDIST_SCENARIO(mpi_under_tdistrun) {
  const int env_rank = env_int("RANK", -1);
  const int restart = env_int("TORCHELASTIC_RESTART_COUNT", -1);
  std::cout << "ENV RANK=" << env_rank << " LOCAL_RANK=" << env_int("LOCAL_RANK", -1)
            << " WORLD_SIZE=" << env_int("WORLD_SIZE", -1) << " RESTART=" << restart << std::endl;
  if (env_rank == env_int("MPI_TEST_FAIL_RANK", -1) &&
      restart < env_int("MPI_TEST_FAIL_UNTIL_RESTART", 1 << 20)) {
    std::cerr << "boom: rank " << env_rank << " fails on purpose" << std::endl;
    std::exit(3);
  }
  init_process_group(InitProcessGroupOptions().backend("mpi"));
  const int rank = get_rank();
  const int n = get_world_size();
  if (rank != env_rank || n != env_int("WORLD_SIZE", -1) || mpi::world_rank() != rank ||
      mpi::world_size() != n) {
    std::cerr << "rank mismatch: group " << rank << "/" << n << ", MPI " << mpi::world_rank() << "/"
              << mpi::world_size() << std::endl;
    std::exit(4);
  }
  at::Tensor t = at::full({5}, static_cast<float>(rank + 1));
  all_reduce(t);
  const float tri = n * (n + 1) / 2.0f;
  at::Tensor in = at::arange(4 * n, at::kFloat) * static_cast<float>(rank + 1);
  at::Tensor out = at::empty({4});
  reduce_scatter_tensor(out, in);
  at::Tensor want = at::arange(4 * rank, 4 * rank + 4, at::kFloat) * tri;
  const bool ok = at::all(t == tri).item<bool>() && at::allclose(out, want);
  std::cout << "rank " << rank << (ok ? " ok" : " WRONG") << " sum=" << t[0].item<float>()
            << std::endl;
  destroy_process_group();
  if (!ok) std::exit(5);
}

std::vector<std::string> tdistrun_mpi(int nproc, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {launch::testing::tdistrun(),
                                   "--standalone",
                                   "--nproc-per-node",
                                   std::to_string(nproc),
                                   "--launcher",
                                   "mpirun",
                                   "--mpirun-args",
                                   "--mca btl self,vader,tcp",
                                   "--monitor-interval",
                                   "0.05",
                                   "--stop-timeout",
                                   "3"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(TEST_BINARY_PATH);
  return argv;
}

std::map<std::string, std::string> scenario_env(std::map<std::string, std::string> extra = {}) {
  extra["TDIST_TEST_SCENARIO"] = "mpi_under_tdistrun";
  extra["OMP_NUM_THREADS"] = "1";
  return extra;
}

TEST(MpiTdistrun, CollectivesAtNproc2And3) {
  for (int n : {2, 3}) {
    SCOPED_TRACE("nproc " + std::to_string(n));
    auto r = run(tdistrun_mpi(n), scenario_env(), std::chrono::seconds(120));
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    for (int rank = 0; rank < n; ++rank) {
      const std::string p = "[rank " + std::to_string(rank) + "]: ";
      EXPECT_EQ(lines_with(r.out, p + "ENV RANK=" + std::to_string(rank) +
                                      " LOCAL_RANK=" + std::to_string(rank) +
                                      " WORLD_SIZE=" + std::to_string(n) + " RESTART=0")
                    .size(),
                1u)
          << r.out;
      EXPECT_EQ(lines_with(r.out, p + "rank " + std::to_string(rank) + " ok sum=").size(), 1u)
          << r.out;
    }
  }
}

TEST(MpiTdistrun, FailureIsSummarisedAndRestarted) {
  auto r = run(tdistrun_mpi(2, {"--max-restarts", "1"}),
               scenario_env({{"MPI_TEST_FAIL_RANK", "1"}, {"MPI_TEST_FAIL_UNTIL_RESTART", "1"}}),
               std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("restarting the workers (restart 1 of 1) after first failure: rank 1 "
                       "(local rank 1"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("attempt 0) exited with code 3"), std::string::npos) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[rank " + std::to_string(rank) + "]: ";
    EXPECT_EQ(lines_with(r.out, p + "ENV RANK=" + std::to_string(rank)).size(), 2u) << r.out;
    EXPECT_EQ(lines_with(r.out, p + "rank " + std::to_string(rank) + " ok").size(), 1u) << r.out;
  }
}

TEST(MpiTdistrun, GivesUpAfterMaxRestartsWithTheFailedRanksLastWords) {
  auto r =
      run(tdistrun_mpi(2), scenario_env({{"MPI_TEST_FAIL_RANK", "0"}}), std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("job failed after 1 attempt(s) (--max-restarts 0)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("first failure: rank 0 (local rank 0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[rank 0]: boom: rank 0 fails on purpose"), std::string::npos) << r.err;
}

TEST(MpiTdistrun, PlainTdistrunNamesTheFlagAndMultiNodeIsRefused) {
  auto r =
      run({launch::testing::tdistrun(), "--standalone", "--nproc-per-node", "2", TEST_BINARY_PATH},
          scenario_env(), std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE((r.out + r.err).find("add `--launcher mpirun`"), std::string::npos) << describe(r);

  auto multi =
      run({launch::testing::tdistrun(), "--nnodes", "2", "--launcher", "mpirun", TEST_BINARY_PATH},
          scenario_env(), std::chrono::seconds(30));
  EXPECT_EQ(multi.exit_code, 2) << describe(multi);
  EXPECT_NE(multi.err.find("--launcher mpirun runs a single node"), std::string::npos) << multi.err;

  auto bogus = run({launch::testing::tdistrun(), "--launcher", "srun", TEST_BINARY_PATH},
                   scenario_env(), std::chrono::seconds(30));
  EXPECT_EQ(bogus.exit_code, 2) << describe(bogus);
  EXPECT_NE(bogus.err.find("--launcher must be fork or mpirun"), std::string::npos) << bogus.err;
}

}  // namespace
}  // namespace tdist::testing

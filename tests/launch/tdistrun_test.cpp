// tdistrun end to end on one node: the env contract, output, logs, failures, restarts,
// signals. Each test runs the real binary on tests/launch/test_worker.cpp.
#include <signal.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>

#include "launch/run_process.h"
#include "tdist/detail/util/openblas_core.h"
#include "tdist/launch/numa_binding.h"

namespace tdist::launch::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Fast failure handling for the tests.
std::vector<std::string> launcher(std::vector<std::string> flags) {
  std::vector<std::string> argv = {tdistrun(), "--monitor-interval", "0.05", "--stop-timeout", "3"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

std::vector<std::string> with_worker(std::vector<std::string> flags,
                                     const std::vector<std::string>& worker_args) {
  auto argv = launcher(std::move(flags));
  argv.push_back(worker());
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

TEST(Tdistrun, EnvContractAtWorldSizes1To4) {
  for (int n : {1, 2, 3, 4}) {
    auto r = run(
        with_worker({"--standalone", "--nproc-per-node", std::to_string(n), "--max-restarts", "2"},
                    {"--print-env"}));
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    std::string port = env_of(r.out, 0, "MASTER_PORT");
    std::string run_id = env_of(r.out, 0, "TORCHELASTIC_RUN_ID");
    std::string secret_file = env_of(r.out, 0, "TDIST_STORE_SECRET_FILE");
    EXPECT_GT(std::stoi(port), 0);
    EXPECT_FALSE(run_id.empty());
    for (int rank = 0; rank < n; ++rank) {
      SCOPED_TRACE("world " + std::to_string(n) + " rank " + std::to_string(rank));
      EXPECT_EQ(env_of(r.out, rank, "RANK"), std::to_string(rank));
      EXPECT_EQ(env_of(r.out, rank, "LOCAL_RANK"), std::to_string(rank));
      EXPECT_EQ(env_of(r.out, rank, "WORLD_SIZE"), std::to_string(n));
      EXPECT_EQ(env_of(r.out, rank, "LOCAL_WORLD_SIZE"), std::to_string(n));
      EXPECT_EQ(env_of(r.out, rank, "GROUP_RANK"), "0");
      EXPECT_EQ(env_of(r.out, rank, "GROUP_WORLD_SIZE"), "1");
      EXPECT_EQ(env_of(r.out, rank, "ROLE_RANK"), std::to_string(rank));
      EXPECT_EQ(env_of(r.out, rank, "ROLE_NAME"), "default");
      EXPECT_EQ(env_of(r.out, rank, "MASTER_ADDR"), "127.0.0.1");
      EXPECT_EQ(env_of(r.out, rank, "MASTER_PORT"), port);
      EXPECT_EQ(env_of(r.out, rank, "TORCHELASTIC_RUN_ID"), run_id);
      EXPECT_EQ(env_of(r.out, rank, "TORCHELASTIC_RESTART_COUNT"), "0");
      EXPECT_EQ(env_of(r.out, rank, "TORCHELASTIC_MAX_RESTARTS"), "2");
      EXPECT_EQ(env_of(r.out, rank, "TDIST_STORE_SECRET_FILE"), secret_file);
      // Several workers on a node get 1 thread each (as torchrun); one worker inherits the
      // launcher's own setting.
      const char* inherited = std::getenv("OMP_NUM_THREADS");
      EXPECT_EQ(env_of(r.out, rank, "OMP_NUM_THREADS"),
                n > 1 ? "1" : (inherited ? inherited : "<unset>"));
    }
    EXPECT_EQ(lines_with(r.out, "[rank 0]: SECRET_MODE=600").size(), 1u) << r.out;
    auto secret = lines_with(r.out, "[rank 0]: SECRET=");
    ASSERT_EQ(secret.size(), 1u);
    EXPECT_EQ(secret[0].size(), std::string("[rank 0]: SECRET=").size() + 64);
    EXPECT_FALSE(std::filesystem::exists(secret_file)) << "the secret must not outlive the job";
  }
}

TEST(OpenBlasCore, OnlyTheGenericFallbackIsFixedAndOnlyWithVectorUnits) {
  EXPECT_EQ(tdist::detail::openblas_coretype_fix(""), nullptr);  // not OpenBLAS
  EXPECT_EQ(tdist::detail::openblas_coretype_fix("SkylakeX"), nullptr);
  EXPECT_EQ(tdist::detail::openblas_coretype_fix("Haswell"), nullptr);
  const char* fix = tdist::detail::openblas_coretype_fix("Prescott");
#if defined(__x86_64__)
  __builtin_cpu_init();
  const char* expected =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") ? "SkylakeX"
      : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")       ? "Haswell"
                                                                              : nullptr;
  EXPECT_STREQ(fix ? fix : "<none>", expected ? expected : "<none>");
#else
  EXPECT_EQ(fix, nullptr);
#endif
}

// Note [OpenBLAS on CPUs it does not know]: the workers get kernels for this CPU when the
// system's OpenBLAS would fall back to its generic ones, and a user's choice is kept.
TEST(Tdistrun, WorkersGetOpenBlasKernelsForThisCpuUnlessTheUserChose) {
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = before ? before : "";
  unsetenv("OPENBLAS_CORETYPE");
  const char* fix = tdist::detail::openblas_coretype_fix(tdist::detail::system_openblas_core());
  auto r = run(with_worker({"--nproc-per-node", "2"}, {"--print-env"}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(env_of(r.out, rank, "OPENBLAS_CORETYPE"), fix ? fix : "<unset>");
  }
  EXPECT_EQ(r.err.find("OpenBLAS does not recognise this CPU") != std::string::npos, fix != nullptr)
      << r.err;
  auto chosen = run(with_worker({"--nproc-per-node", "2"}, {"--print-env"}),
                    {{"OPENBLAS_CORETYPE", "Haswell"}});
  ASSERT_EQ(chosen.exit_code, 0) << describe(chosen);
  EXPECT_EQ(env_of(chosen.out, 1, "OPENBLAS_CORETYPE"), "Haswell");
  EXPECT_EQ(chosen.err.find("OpenBLAS"), std::string::npos) << chosen.err;
  if (before) setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
}

TEST(Tdistrun, MasterPortAndRunIdAsGivenAndUserSecretKept) {
  int port = free_tcp_port();
  auto r = run(with_worker({"--nproc-per-node", "2", "--master-port", std::to_string(port),
                            "--rdzv-id", "myjob"},
                           {"--print-env"}),
               {{"TDIST_STORE_SECRET", "users-own"}});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(env_of(r.out, 1, "MASTER_PORT"), std::to_string(port));
  EXPECT_EQ(env_of(r.out, 1, "TORCHELASTIC_RUN_ID"), "myjob");
  EXPECT_EQ(env_of(r.out, 1, "TDIST_STORE_SECRET_FILE"), "<unset>");
  auto off = run(with_worker({"--no-store-secret"}, {"--print-env"}));
  ASSERT_EQ(off.exit_code, 0) << describe(off);
  EXPECT_EQ(env_of(off.out, 0, "TDIST_STORE_SECRET_FILE"), "<unset>");
}

TEST(Tdistrun, EveryLineIsPrefixedAndWhole) {
  const int lines = 300, n = 3;
  auto r =
      run(with_worker({"--nproc-per-node", std::to_string(n)}, {"--lines", std::to_string(lines)}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int rank = 0; rank < n; ++rank) {
    std::string prefix = "[rank " + std::to_string(rank) + "]: ";
    auto mine = lines_with(r.out, prefix);
    ASSERT_EQ(mine.size(), static_cast<size_t>(lines + 1)) << r.out;  // + "rank R done"
    for (int i = 0; i < lines; ++i) {
      // Written by the worker in three pieces; the launcher must keep the line whole.
      EXPECT_EQ(mine[i],
                prefix + "line " + std::to_string(i) + " of rank " + std::to_string(rank) + " end");
    }
  }
  for (const auto& line : lines_with(r.out, "")) {
    EXPECT_EQ(line.rfind("[rank ", 0), 0u) << "unprefixed line: " << line;
  }
}

TEST(Tdistrun, LogDirHoldsEachRanksRawOutput) {
  std::string dir = temp_dir();
  auto r = run(with_worker(
      {"--nproc-per-node", "2", "--log-dir", dir, "--rdzv-id", "job", "--redirects", "1"},
      {"--lines", "3"}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int rank = 0; rank < 2; ++rank) {
    std::string base = dir + "/job/attempt_0/rank_" + std::to_string(rank);
    std::string expect;
    for (int i = 0; i < 3; ++i) {
      expect += "line " + std::to_string(i) + " of rank " + std::to_string(rank) + " end\n";
    }
    expect += "rank " + std::to_string(rank) + " done\n";
    EXPECT_EQ(read_file(base + "/stdout.log"), expect);
    EXPECT_TRUE(std::filesystem::exists(base + "/stderr.log"));
  }
  // --redirects 1: stdout went only to the files.
  EXPECT_TRUE(lines_with(r.out, "[rank").empty()) << r.out;
}

TEST(Tdistrun, TeeAndLocalRanksFilter) {
  std::string dir = temp_dir();
  auto r = run(with_worker({"--nproc-per-node", "2", "--log-dir", dir, "--redirects", "3", "--tee",
                            "1", "--local-ranks-filter", "1"},
                           {"--lines", "1"}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(lines_with(r.out, "[rank 0]").empty()) << r.out;
  EXPECT_EQ(lines_with(r.out, "[rank 1]: line 0 of rank 1 end").size(), 1u) << r.out;
  EXPECT_NE(read_file(dir + "/none/attempt_0/rank_0/stdout.log").find("line 0 of rank 0"),
            std::string::npos);
}

TEST(Tdistrun, FailureStopsOthersAndSummarisesTheFirstFailure) {
  auto r = run(with_worker({"--nproc-per-node", "3"},
                           {"--fail-rank", "1", "--exit", "3", "--stderr",
                            "boom: the disk is on fire", "--on-term", "--sleep", "60"}));
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.err.find("first failure: rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[rank 1]: boom: the disk is on fire"), std::string::npos) << r.err;
  // The healthy ranks were stopped with SIGTERM rather than left running.
  EXPECT_EQ(lines_with(r.out, "[rank 0]: rank 0 got SIGTERM").size(), 1u) << r.out;
  EXPECT_EQ(lines_with(r.out, "[rank 2]: rank 2 got SIGTERM").size(), 1u) << r.out;
}

// Note [Blaming the lost peer]: rank 1 fails but takes 0.6 s to exit, while ranks 0 and 2,
// which lost their connections to it, abort at once and are reaped first.
TEST(Tdistrun, TheRankOthersLostIsNamedAsTheFirstFailure) {
  auto r = run(with_worker({"--nproc-per-node", "3"},
                           {"--fail-rank", "1", "--exit", "3", "--fail-delay", "0.6", "--stderr",
                            "boom: the disk is on fire", "--cascade"}));
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("first failure: rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[rank 1]: boom: the disk is on fire"), std::string::npos) << r.err;
}

// A rank named as lost that stays alive is not the cause: after the wait, the first failure
// is named and the live rank stopped.
TEST(Tdistrun, ALostRankThatStaysAliveIsNotBlamed) {
  auto r =
      run(with_worker({"--nproc-per-node", "2"},
                      {"--fail-rank", "0", "--exit", "4", "--stderr",
                       "rank 0: gloo broadcast #3 (receiving from rank 1): lost the connection "
                       "to rank 1 (the peer died or closed the group)",
                       "--on-term", "--sleep", "60"}),
          {}, seconds(30));
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.err.find("first failure: rank 0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 4"), std::string::npos) << r.err;
  EXPECT_EQ(lines_with(r.out, "[rank 1]: rank 1 got SIGTERM").size(), 1u) << r.out;
}

TEST(Tdistrun, SignalDeathIsNamedAndSigtermIgnorersAreKilled) {
  auto argv = launcher({"--nproc-per-node", "2"});
  argv[4] = "0.3";  // --stop-timeout
  argv.push_back(worker());
  for (const char* a : {"--fail-rank", "0", "--signal", "9", "--ignore-term", "--sleep", "60"}) {
    argv.push_back(a);
  }
  auto r = run(argv, {}, seconds(30));
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.err.find("first failure: rank 0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("killed by signal 9 (SIGKILL)"), std::string::npos) << r.err;
}

TEST(Tdistrun, RestartsAfterAFailureAndSucceeds) {
  auto r = run(
      with_worker({"--nproc-per-node", "2", "--max-restarts", "1"},
                  {"--print-env", "--fail-rank", "1", "--exit", "5", "--fail-until-restart", "1"}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("restarting the workers (restart 1 of 1)"), std::string::npos) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    std::string prefix = "[rank " + std::to_string(rank) + "]: ENV TORCHELASTIC_RESTART_COUNT=";
    auto counts = lines_with(r.out, prefix);
    ASSERT_EQ(counts.size(), 2u) << r.out;
    EXPECT_EQ(counts[0], prefix + "0");
    EXPECT_EQ(counts[1], prefix + "1");
  }
  EXPECT_EQ(lines_with(r.out, "[rank 1]: rank 1 done").size(), 1u);
}

// Each worker runs on exactly the CPUs the topology code computes for this machine (on a
// two-core machine `exclusive` gives each worker its own core), and the launcher says so once.
TEST(Tdistrun, NumaBindingBindsEachWorkerBeforeExec) {
  for (const char* mode : {"node", "socket", "exclusive", "core-complex"}) {
    auto r = run(with_worker({"--nproc-per-node", "2", "--numa-binding", mode}, {"--print-cpus"}));
    std::vector<std::set<int>> expected;
    try {
      expected =
          numa_cpu_sets(parse_numa_binding(mode), 2, CpuTopology::read("/sys"), allowed_cpus());
    } catch (const InvalidArgument& e) {  // exclusive on a one-core machine
      EXPECT_EQ(r.exit_code, 2) << mode << ": " << describe(r);
      continue;
    }
    ASSERT_EQ(r.exit_code, 0) << mode << ": " << describe(r);
    for (int rank = 0; rank < 2; ++rank) {
      std::string list;
      for (int cpu : expected.at(rank)) list += (list.empty() ? "" : ",") + std::to_string(cpu);
      const std::string prefix = "[rank " + std::to_string(rank) + "]: CPUS ";
      ASSERT_EQ(lines_with(r.out, prefix).size(), 1u) << r.out;
      EXPECT_EQ(lines_with(r.out, prefix)[0], prefix + list) << mode;
    }
    EXPECT_NE(r.err.find(std::string("--numa-binding ") + mode +
                         ": CPUs per local rank {0: " + format_cpu_list(expected[0]) +
                         ", 1: " + format_cpu_list(expected[1]) + "}"),
              std::string::npos)
        << r.err;
  }
}

// Under `taskset -c 0` one core is left for two exclusive workers: a usage error naming
// the node, before any worker starts.
TEST(Tdistrun, NumaBindingThatLeavesARankNoCpuIsAUsageError) {
  if (!std::filesystem::exists("/usr/bin/taskset")) GTEST_SKIP() << "no taskset";
  auto argv =
      with_worker({"--nproc-per-node", "2", "--numa-binding", "exclusive"}, {"--print-cpus"});
  argv.insert(argv.begin(), {"/usr/bin/taskset", "-c", "0"});
  auto r = run(argv);
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("--numa-binding exclusive: NUMA node 0 has 1 usable physical core(s) (CPUs "
                       "0) for 2 local ranks"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(lines_with(r.out, "[rank 0]: CPUS").size(), 0u) << r.out;
}

TEST(Tdistrun, GivesUpAfterMaxRestarts) {
  auto r = run(
      with_worker({"--nproc-per-node", "2", "--max-restarts", "2"},
                  {"--print-env", "--fail-rank", "0", "--exit", "6", "--stderr", "still broken"}));
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_EQ(lines_with(r.out, "[rank 0]: ENV TORCHELASTIC_RESTART_COUNT=").size(), 3u);
  EXPECT_NE(r.err.find("job failed after 3 attempt(s) (--max-restarts 2)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("attempt 2) exited with code 6"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[rank 0]: still broken"), std::string::npos) << r.err;
}

std::vector<pid_t> wait_for_pids(const std::string& dir, size_t count) {
  auto deadline = std::chrono::steady_clock::now() + seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<pid_t> pids;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      std::string text = read_file(entry.path().string());
      if (!text.empty() && text.back() == '\n') pids.push_back(std::stoi(text));
    }
    if (pids.size() == count) return pids;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return {};
}

bool all_dead(const std::vector<pid_t>& pids, milliseconds within) {
  auto deadline = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < deadline) {
    bool any = false;
    for (pid_t p : pids) any = any || process_alive(p);
    if (!any) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return false;
}

TEST(Tdistrun, SigtermIsForwardedAndNoOrphansRemain) {
  std::string dir = temp_dir();
  Proc proc(with_worker({"--nproc-per-node", "2"},
                        {"--pid-dir", dir, "--spawn-child", "--on-term", "--sleep", "60"}));
  auto pids = wait_for_pids(dir, 4);  // two workers, two grandchildren
  ASSERT_EQ(pids.size(), 4u) << proc.out_so_far();
  proc.kill(SIGTERM);
  auto r = proc.wait(seconds(30));
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << describe(r);
  EXPECT_EQ(lines_with(r.out, "[rank 0]: rank 0 got SIGTERM").size(), 1u) << r.out;
  EXPECT_EQ(lines_with(r.out, "[rank 1]: rank 1 got SIGTERM").size(), 1u) << r.out;
  EXPECT_TRUE(all_dead(pids, seconds(5))) << "workers or their children outlived tdistrun";
}

TEST(Tdistrun, SigintEscalatesToSigkillForStubbornWorkers) {
  std::string dir = temp_dir();
  auto argv =
      with_worker({"--nproc-per-node", "2"}, {"--pid-dir", dir, "--ignore-term", "--sleep", "60"});
  argv[4] = "0.3";  // --stop-timeout
  Proc proc(argv);
  auto pids = wait_for_pids(dir, 2);
  ASSERT_EQ(pids.size(), 2u) << proc.out_so_far();
  proc.kill(SIGINT);
  auto r = proc.wait(seconds(30));
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << describe(r);
  EXPECT_NE(r.err.find("got SIGINT"), std::string::npos) << r.err;
  EXPECT_TRUE(all_dead(pids, seconds(5)));
}

TEST(Tdistrun, WorkersDieWithAKilledLauncher) {
  std::string dir = temp_dir();
  Proc proc(
      with_worker({"--nproc-per-node", "2"}, {"--print-env", "--pid-dir", dir, "--sleep", "60"}));
  auto pids = wait_for_pids(dir, 2);
  ASSERT_EQ(pids.size(), 2u) << proc.out_so_far();
  std::string secret_file;
  for (int i = 0; i < 500 && secret_file.empty(); ++i) {
    secret_file = env_of(proc.out_so_far(), 0, "TDIST_STORE_SECRET_FILE");
    std::this_thread::sleep_for(milliseconds(10));
  }
  proc.kill(SIGKILL);  // no chance to clean up: PR_SET_PDEATHSIG does it
  proc.wait(seconds(10));
  EXPECT_TRUE(all_dead(pids, seconds(5)));
  // The dead launcher's secret is swept by the next launcher on this machine.
  ASSERT_TRUE(std::filesystem::exists(secret_file)) << secret_file;
  auto next = run(with_worker({}, {}));
  EXPECT_EQ(next.exit_code, 0) << describe(next);
  EXPECT_FALSE(std::filesystem::exists(secret_file));
}

TEST(Tdistrun, MissingProgramIsAUsageError) {
  auto r = run(launcher({"--nproc-per-node", "2", "./no/such/program"}));
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("cannot execute './no/such/program'"), std::string::npos) << r.err;
  auto help = run({tdistrun(), "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--nproc-per-node"), std::string::npos);
}

}  // namespace
}  // namespace tdist::launch::testing

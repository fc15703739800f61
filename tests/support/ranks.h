#pragma once

// Multi-rank test harnesses.
//  - run_ranks_as_threads: fast; ranks are threads sharing one HashStore.
//  - run_ranks_as_processes: end-to-end; ranks are real processes. The test binary
//    re-executes itself with TDIST_TEST_SCENARIO=<name>, and main() (tests/support/main.cpp)
//    runs the scenario registered under that name instead of GoogleTest. Each child gets
//    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT.

#include <chrono>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "tdist/store/store.h"

namespace tdist::testing {

/// Runs fn(rank, world_size, store) on world_size threads; rethrows the first failure
/// (prefixed with the rank) after every thread has finished.
void run_ranks_as_threads(int world_size,
                          const std::function<void(int rank, int world_size, StorePtr store)>& fn);

using Scenario = std::function<void()>;

/// Registers a scenario at static-initialisation time. Use TDIST_SCENARIO below.
struct ScenarioRegistrar {
  ScenarioRegistrar(const std::string& name, Scenario fn);
};

/// Defines a function run in each child process:
///   TDIST_SCENARIO(allreduce_sum) { tdist::init_process_group(); ... }
/// A scenario fails by throwing or by a failed EXPECT/ASSERT (the child exits non-zero).
#define TDIST_SCENARIO(name)                                                  \
  static void tdist_scenario_##name();                                        \
  static ::tdist::testing::ScenarioRegistrar tdist_scenario_registrar_##name( \
      #name, &tdist_scenario_##name);                                         \
  static void tdist_scenario_##name()

struct RankResult {
  int rank = -1;
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // the signal that killed it, 0 if none
  bool timed_out = false;
  std::string output;  // stdout and stderr together
  /// When the harness saw it end (within 50 ms); steady_clock is the machine's monotonic
  /// clock, so a rank's own steady_clock readings compare with it.
  std::chrono::steady_clock::time_point ended;
  bool ok() const { return exit_code == 0 && signal == 0 && !timed_out; }
};

struct ProcessOptions {
  /// Extra environment for every rank ("KEY" -> "value"); overrides the defaults above.
  std::map<std::string, std::string> env;
  /// Per-rank extra environment, applied after `env`.
  std::map<int, std::map<std::string, std::string>> rank_env;
  /// Kill every rank still running after this long (then timed_out is set).
  std::chrono::milliseconds timeout = std::chrono::seconds(120);
  /// Do not set MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE (for bad-launch tests).
  bool bare_env = false;
  /// As soon as one rank is killed by a signal, SIGKILL the others (what a launcher's agent
  /// does when a worker dies); their results then show SIGKILL, not timed_out.
  bool kill_all_when_one_is_killed = false;
};

/// Spawns world_size processes running `scenario`, waits for all of them, returns their
/// results in rank order.
std::vector<RankResult> run_ranks_as_processes(const std::string& scenario, int world_size,
                                               const ProcessOptions& options = {});

/// EXPECTs every rank succeeded; on failure prints each failing rank's output.
void expect_all_ok(const std::vector<RankResult>& results);

/// Runs `scenario` at each world size in turn and EXPECTs every rank of each run succeeded
/// (failures are traced with their world size).
void expect_all_ok_at_worlds(const std::string& scenario, std::initializer_list<int> worlds,
                             const ProcessOptions& options = {});

/// A free TCP port on 127.0.0.1 (bound then released; a race is possible but rare).
int free_port();

/// A SLURM job id whose derived store port (20000 + id % 20000, Note [Launch environment
/// precedence]) is free on 127.0.0.1 now.
int slurm_job_id_with_free_port();

/// What srun sets for every task of a one-node step of `world_size` tasks on localhost, and
/// for task `rank` (ProcessOptions::env and rank_env, with bare_env).
std::map<std::string, std::string> srun_environment(int world_size, int job_id);
std::map<std::string, std::string> srun_task_environment(int rank);

/// A fresh empty directory under the system temp dir, removed at process exit.
std::string make_temp_dir(const std::string& prefix = "tdist-test");

/// Environment variable as int, or fallback.
int env_int(const char* name, int fallback);

/// Environment variable as a string, or fallback.
std::string env_str(const char* name, const char* fallback = "");

/// Path of the running test executable.
std::string self_executable();

}  // namespace tdist::testing

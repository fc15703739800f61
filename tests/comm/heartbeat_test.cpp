// Heartbeats (Note [Heartbeats] in src/comm/heartbeat.h): a rank stopped with SIGSTOP keeps
// its sockets open, so without heartbeats its peers would wait in their collective for the
// group's timeout. With them, every surviving rank names the stopped one and ends with exit
// code 75 within the silence (misses x interval) plus an interval or two. Rank 0 hosts the
// store, so its loss is noticed through the store's silence instead. World 3; more trials
// and other intervals with TDIST_HEARTBEAT_TRIALS, TDIST_HEARTBEAT_TEST_INTERVAL_MS.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "support/ranks.h"
#include "tdist/comm/distributed.h"

namespace tdist {
// Named, not anonymous: test_comm is one unity translation unit.
namespace heartbeat_test {

constexpr int kLostExitCode = 75;

TDIST_SCENARIO(heartbeat_stopped_peer) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int stopped = std::atoi(std::getenv("STOPPED_RANK"));
  at::Tensor t = torch::ones({4});
  all_reduce(t);  // every rank is up and beating
  if (get_rank() == stopped) {
    // A child ends this process later, so that the harness need not wait for its timeout;
    // the heartbeats must fire long before.
    const pid_t self = getpid();
    const int kill_after_ms = std::atoi(std::getenv("KILL_STOPPED_AFTER_MS"));
    if (fork() == 0) {
      usleep(static_cast<useconds_t>(kill_after_ms) * 1000);
      kill(self, SIGKILL);
      _exit(0);
    }
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    std::printf(
        "stopped at %lld\n",
        static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(now).count()));
    std::fflush(stdout);
    raise(SIGSTOP);
  }
  all_reduce(t);  // blocks on the stopped rank until the heartbeat ends this process
  std::printf("all_reduce returned without the stopped rank\n");
  std::exit(4);
}

TDIST_SCENARIO(heartbeat_quiet_run) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  // Ranks finish at different times: a finished rank's silence is not a loss.
  at::Tensor t = torch::ones({1024});
  for (int i = 0; i < 20; ++i) all_reduce(t);
  std::this_thread::sleep_for(std::chrono::milliseconds(400 * get_rank()));
  destroy_process_group();
}

std::chrono::steady_clock::time_point stopped_at(const std::string& output) {
  const auto at = output.find("stopped at ");
  if (at == std::string::npos) return {};
  const long long us = std::atoll(output.c_str() + at + 11);
  return std::chrono::steady_clock::time_point(std::chrono::microseconds(us));
}

struct Trial {
  std::vector<double> detection_s;  // per surviving rank: stop -> its exit
};

Trial run_trial(int world, int stopped, int interval_ms, int misses) {
  testing::ProcessOptions options;
  options.env = {{"TDIST_HEARTBEAT_INTERVAL_MS", std::to_string(interval_ms)},
                 {"TDIST_HEARTBEAT_MISSES", std::to_string(misses)},
                 {"STOPPED_RANK", std::to_string(stopped)},
                 {"KILL_STOPPED_AFTER_MS", std::to_string(interval_ms * misses * 2 + 2000)}};
  options.timeout = std::chrono::seconds(60);
  const auto results = testing::run_ranks_as_processes("heartbeat_stopped_peer", world, options);
  Trial trial;
  const auto stop = stopped_at(results[stopped].output);
  EXPECT_EQ(results[stopped].signal, SIGKILL) << results[stopped].output;
  const std::string lost_text = stopped == 0 ? "rank 0, which hosts the store, stopped answering"
                                             : "rank " + std::to_string(stopped) + " (host ";
  for (const auto& r : results) {
    if (r.rank == stopped) continue;
    EXPECT_EQ(r.exit_code, kLostExitCode) << "rank " << r.rank << ":\n" << r.output;
    EXPECT_NE(r.output.find(lost_text), std::string::npos) << "rank " << r.rank << ":\n"
                                                           << r.output;
    EXPECT_NE(r.output.find("restart the job from its newest checkpoint"), std::string::npos)
        << r.output;
    trial.detection_s.push_back(std::chrono::duration<double>(r.ended - stop).count());
    if (testing::env_int("TDIST_HEARTBEAT_VERBOSE", 0)) {
      std::printf("rank %d stopped, rank %d ended after %.3f s: %s", stopped, r.rank,
                  trial.detection_s.back(), r.output.c_str());
    }
  }
  return trial;
}

TEST(Heartbeat, AStoppedRankIsNamedByEverySurvivor) {
  const int interval_ms = testing::env_int("TDIST_HEARTBEAT_TEST_INTERVAL_MS", 200);
  const int misses = 5;
  const int trials = testing::env_int("TDIST_HEARTBEAT_TRIALS", 1);
  std::vector<double> all;
  for (int i = 0; i < trials; ++i) {
    for (int stopped : {2, 0}) {  // a plain rank; rank 0, the store's host
      SCOPED_TRACE("trial " + std::to_string(i) + ", rank " + std::to_string(stopped) + " stopped");
      const Trial trial = run_trial(3, stopped, interval_ms, misses);
      for (double s : trial.detection_s) {
        // The silence, then up to two intervals to see it and to spread the word; more
        // would mean the heartbeat missed and something else ended the rank.
        EXPECT_LT(s, (interval_ms * (misses + 3) + 1000) / 1000.0);
        all.push_back(s);
      }
    }
  }
  std::sort(all.begin(), all.end());
  if (!all.empty()) {
    const size_t p99 = std::min(all.size() - 1, static_cast<size_t>(all.size() * 0.99));
    std::printf(
        "heartbeats: interval %d ms, %d misses, %d trials x 2 (rank 2, rank 0 stopped): stop "
        "-> exit of each survivor min %.2f s, median %.2f s, p99 %.2f s, max %.2f s\n",
        interval_ms, misses, trials, all.front(), all[all.size() / 2], all[p99], all.back());
  }
}

TEST(Heartbeat, RanksThatFinishAtDifferentTimesAreNotLost) {
  testing::ProcessOptions options;
  options.env = {{"TDIST_HEARTBEAT_INTERVAL_MS", "100"}, {"TDIST_HEARTBEAT_MISSES", "2"}};
  testing::expect_all_ok(testing::run_ranks_as_processes("heartbeat_quiet_run", 3, options));
}

TEST(Heartbeat, MalformedSettingsAreNamed) {
  testing::ProcessOptions options;
  options.env = {{"TDIST_HEARTBEAT_INTERVAL_MS", "soon"}};
  const auto results = testing::run_ranks_as_processes("heartbeat_quiet_run", 2, options);
  for (const auto& r : results) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("TDIST_HEARTBEAT_INTERVAL_MS='soon'"), std::string::npos) << r.output;
  }
}

}  // namespace heartbeat_test
}  // namespace tdist

// Heartbeats (Note [Heartbeats] in src/comm/heartbeat.h): a rank stopped with SIGSTOP keeps
// its sockets open, so without heartbeats its peers would wait in their collective for the
// group's timeout. With them, every surviving rank names the stopped one within the silence
// (misses x interval) plus an interval or two: the collective it waits in raises
// DistBackendError naming it (Note [Aborting on a lost peer]), and so does every later one.
// A rank that goes on regardless is ended with exit code 75 after the grace, and one whose
// backend cannot be interrupted at once. Rank 0 hosts the store, so its loss is noticed
// through the store's silence instead. World 3; more trials and other intervals with
// TDIST_HEARTBEAT_TRIALS, TDIST_HEARTBEAT_TEST_INTERVAL_MS.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "support/ranks.h"
#include "tdist/comm/backend.h"
#include "tdist/comm/distributed.h"

namespace tdist {
// Named, not anonymous: test_comm is one unity translation unit.
namespace heartbeat_test {

constexpr int kLostExitCode = 75;
constexpr int kRaisedExitCode = 3;

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// All ranks up and beating, then STOPPED_RANK stops itself (a child SIGKILLs it after
/// KILL_STOPPED_AFTER_MS, so that the harness need not wait for its timeout).
void stop_one_rank(const std::function<void()>& first_collective) {
  const int stopped = std::atoi(std::getenv("STOPPED_RANK"));
  first_collective();
  if (get_rank() != stopped) return;
  const pid_t self = getpid();
  const int kill_after_ms = std::atoi(std::getenv("KILL_STOPPED_AFTER_MS"));
  if (fork() == 0) {
    usleep(static_cast<useconds_t>(kill_after_ms) * 1000);
    kill(self, SIGKILL);
    _exit(0);
  }
  std::printf("stopped at %lld\n", static_cast<long long>(now_us()));
  std::fflush(stdout);
  raise(SIGSTOP);
}

/// Prints when and what `collective` raised, or exits 4 when it returned.
void expect_raise(const std::function<void()>& collective) {
  try {
    collective();
  } catch (const DistBackendError& e) {
    std::printf("raised at %lld: %s\n", static_cast<long long>(now_us()), e.what());
    std::fflush(stdout);
    return;
  }
  std::printf("the collective returned without the stopped rank\n");
  std::exit(4);
}

TDIST_SCENARIO(heartbeat_stopped_peer) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  at::Tensor t = torch::ones({4});
  stop_one_rank([&] { all_reduce(t); });
  expect_raise([&] { all_reduce(t); });  // waits on the stopped rank until the loss
  // Every later collective fails at once, naming the loss too.
  const auto before = std::chrono::steady_clock::now();
  expect_raise([&] { broadcast(t, 0); });
  if (std::chrono::steady_clock::now() - before > std::chrono::milliseconds(500)) std::exit(5);
  std::_Exit(kRaisedExitCode);  // as an uncaught exception would, without static destructors
}

TDIST_SCENARIO(heartbeat_error_ignored) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  at::Tensor t = torch::ones({4});
  stop_one_rank([&] { all_reduce(t); });
  expect_raise([&] { all_reduce(t); });
  std::this_thread::sleep_for(std::chrono::seconds(60));  // goes on as if nothing happened
  std::exit(6);
}

TDIST_SCENARIO(heartbeat_not_in_a_collective) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  at::Tensor t = torch::ones({4});
  stop_one_rank([&] { all_reduce(t); });
  // Computing while the loss is declared: the next collective raises it at once.
  std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(std::getenv("COMPUTE_MS"))));
  const auto before = std::chrono::steady_clock::now();
  expect_raise([&] { all_reduce(t); });
  if (std::chrono::steady_clock::now() - before > std::chrono::milliseconds(500)) std::exit(5);
  destroy_process_group();  // the program handled the loss: the grace does not end it
  std::exit(kRaisedExitCode);
}

/// A backend whose all_reduce waits without a way to be interrupted (abort() is the base's).
class UninterruptibleBackend : public CollectiveBackend {
 public:
  UninterruptibleBackend(int rank, int size) : CollectiveBackend(rank, size) {}
  std::string name() const override { return "stuckbackend"; }
  WorkPtr all_reduce(at::Tensor&, const AllreduceOptions&) override {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
};

TDIST_SCENARIO(heartbeat_uninterruptible_backend) {
  Backend::register_backend("stuckbackend",
                            [](const StorePtr&, int rank, int size, std::chrono::milliseconds) {
                              return std::make_shared<UninterruptibleBackend>(rank, size);
                            });
  init_process_group(InitProcessGroupOptions().backend("stuckbackend"));
  at::Tensor t = torch::ones({4});
  stop_one_rank([] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); });
  all_reduce(t);
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

std::chrono::steady_clock::time_point time_after(const std::string& output,
                                                 const std::string& label) {
  const auto at = output.find(label);
  if (at == std::string::npos) return {};
  const long long us = std::atoll(output.c_str() + at + label.size());
  return std::chrono::steady_clock::time_point(std::chrono::microseconds(us));
}

std::string lost_text(int stopped) {
  return stopped == 0 ? "rank 0, which hosts the store, stopped answering"
                      : "rank " + std::to_string(stopped) + " (host ";
}

std::vector<testing::RankResult> run_stop(const std::string& scenario, int world, int stopped,
                                          int interval_ms, int misses,
                                          std::map<std::string, std::string> env = {}) {
  testing::ProcessOptions options;
  options.env = {{"TDIST_HEARTBEAT_INTERVAL_MS", std::to_string(interval_ms)},
                 {"TDIST_HEARTBEAT_MISSES", std::to_string(misses)},
                 {"STOPPED_RANK", std::to_string(stopped)},
                 {"KILL_STOPPED_AFTER_MS", std::to_string(interval_ms * misses * 2 + 2500)}};
  for (auto& [k, v] : env) options.env[k] = v;
  options.timeout = std::chrono::seconds(90);
  auto results = testing::run_ranks_as_processes(scenario, world, options);
  // Ended by a signal, never by itself: its child's SIGKILL, or (1 trial in 20 at 1 s
  // intervals) the SIGHUP the kernel sends a stopped process whose group was orphaned.
  EXPECT_NE(results[stopped].signal, 0) << results[stopped].output;
  return results;
}

struct Trial {
  std::vector<double> detection_s;  // per surviving rank: stop -> its collective raised
};

Trial run_trial(int world, int stopped, int interval_ms, int misses) {
  const auto results = run_stop("heartbeat_stopped_peer", world, stopped, interval_ms, misses);
  Trial trial;
  const auto stop = time_after(results[stopped].output, "stopped at ");
  for (const auto& r : results) {
    if (r.rank == stopped) continue;
    EXPECT_EQ(r.exit_code, kRaisedExitCode) << "rank " << r.rank << ":\n" << r.output;
    // Both the waiting collective and the later one name the lost rank.
    const auto raised = r.output.find("raised at ");
    EXPECT_NE(raised, std::string::npos) << r.output;
    if (raised == std::string::npos) continue;
    EXPECT_NE(r.output.find(lost_text(stopped), raised), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(lost_text(stopped), r.output.find("raised at ", raised + 1)),
              std::string::npos)
        << r.output;
    trial.detection_s.push_back(
        std::chrono::duration<double>(time_after(r.output, "raised at ") - stop).count());
    if (testing::env_int("TDIST_HEARTBEAT_VERBOSE", 0)) {
      std::printf("rank %d stopped, rank %d raised after %.3f s: %s", stopped, r.rank,
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
        // The silence, then up to two intervals to see it and to spread the word, and the
        // abort's 100 ms probe; more would mean the heartbeat missed and something else
        // ended the wait.
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
        "-> each survivor's collective raised min %.2f s, median %.2f s, p99 %.2f s, max %.2f "
        "s\n",
        interval_ms, misses, trials, all.front(), all[all.size() / 2], all[p99], all.back());
  }
}

TEST(Heartbeat, ARankThatGoesOnAfterTheErrorIsEndedAfterTheGrace) {
  const auto results =
      run_stop("heartbeat_error_ignored", 3, 1, 200, 5, {{"TDIST_HEARTBEAT_GRACE_MS", "700"}});
  for (const auto& r : results) {
    if (r.rank == 1) continue;
    EXPECT_EQ(r.exit_code, kLostExitCode) << r.output;
    EXPECT_NE(r.output.find("raised at "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("still running 0.7 s after its collectives were interrupted"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("restart the job from its newest checkpoint"), std::string::npos)
        << r.output;
    const double after_raise =
        std::chrono::duration<double>(r.ended - time_after(r.output, "raised at ")).count();
    EXPECT_GT(after_raise, 0.5) << r.output;
    EXPECT_LT(after_raise, 5.0) << r.output;
  }
}

TEST(Heartbeat, ACollectiveAfterTheLossRaisesAtOnce) {
  const auto results = run_stop("heartbeat_not_in_a_collective", 3, 2, 200, 5,
                                {{"COMPUTE_MS", "2000"}, {"TDIST_HEARTBEAT_GRACE_MS", "20000"}});
  for (const auto& r : results) {
    if (r.rank == 2) continue;
    EXPECT_EQ(r.exit_code, kRaisedExitCode) << r.output;
    EXPECT_NE(r.output.find("all_reduce refused: the gloo process group is broken"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(lost_text(2), r.output.find("raised at ")), std::string::npos)
        << r.output;
  }
}

TEST(Heartbeat, ABackendThatCannotBeInterruptedEndsTheProcess) {
  const auto results = run_stop("heartbeat_uninterruptible_backend", 3, 0, 200, 5);
  for (const auto& r : results) {
    if (r.rank == 0) continue;
    EXPECT_EQ(r.exit_code, kLostExitCode) << r.output;
    EXPECT_NE(r.output.find("cannot interrupt an operation waiting on it"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(lost_text(0)), std::string::npos) << r.output;
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

// Launcher + checkpoints: rank 1 of the GPT job SIGKILLs itself after
// step 5 (TDIST_GPT_CRASH_AT_STEP, first attempt only) under `tdistrun --max-restarts 1`.
// The restarted job resumes from the newest checkpoint (step 4) on its own and must finish
// exactly like an uninterrupted run, with every step logged once in metrics.jsonl.
// --mode ddp: it builds with or without tdist::checkpoint (torch::save fallback) and FSDP.
//
// Why exact (bitwise) equality is the goal: both runs see the same batches (the sampler is a
// function of the seed and the step), the checkpoint restores parameters and AdamW state bit for
// bit, the learning rate is a function of the step, there is no dropout, and both runs use
// the same world size, thread count (1) and collective algorithms, so every float
// operation after the resume is the same operation on the same bits.

#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "launch/netns_pair.h"
#include "launch/run_process.h"
#include "support/ranks.h"

namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 9;
constexpr int kCheckpointInterval = 4;
constexpr int kCrashAfter = 5;

struct JobRun {
  int exit_code = -1;
  std::string output;
  std::vector<nlohmann::json> metrics;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

JobRun train(const std::string& run_dir, const std::string& extra_env) {
  const std::string log = run_dir + ".log";
  std::ostringstream cmd;
  cmd << "env " << extra_env << " " << TDISTRUN_BIN
      << " --standalone --nproc-per-node 2 --max-restarts 1 " << TDIST_GPT_BIN
      << " --mode ddp --n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --batch-size 4"
      << " --steps " << kSteps << " --checkpoint-interval " << kCheckpointInterval
      << " --eval-interval 3 --eval-batches 2 --warmup 2 --lr 0.01 --threads 1 --timeout 60"
      << " --max-new-tokens 0 --log-interval 1 --run-dir " << run_dir << " > " << log << " 2>&1";
  JobRun run;
  int status = std::system(cmd.str().c_str());
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.output = slurp(log);
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(metrics, line)) run.metrics.push_back(nlohmann::json::parse(line));
  return run;
}

/// (step, loss) of every record of `kind`, in file order.
std::vector<std::pair<int64_t, double>> losses(const JobRun& run, const std::string& kind) {
  std::vector<std::pair<int64_t, double>> out;
  for (const auto& r : run.metrics) {
    if (r["kind"] == kind) out.emplace_back(r["step"].get<int64_t>(), r["loss"].get<double>());
  }
  return out;
}

// A rank that stops (SIGSTOP) keeps its sockets open: only heartbeats notice it. Every
// survivor names it and ends, tdistrun restarts the job, and the job resumes from the newest
// checkpoint and finishes like an uninterrupted run.
TEST(GptRestart, StoppedRankIsNamedByHeartbeatsAndTheJobResumes) {
  const std::string dir = tdist::testing::make_temp_dir("gpt-stop");
  const auto start = std::chrono::steady_clock::now();
  const int interval_ms = tdist::testing::env_int("TDIST_HEARTBEAT_TEST_INTERVAL_MS", 200);
  JobRun stopped =
      train(dir + "/stopped", "TDIST_GPT_CRASH_AT_STEP=" + std::to_string(kCrashAfter) +
                                  " TDIST_GPT_CRASH_SIGNAL=STOP"
                                  " TDIST_HEARTBEAT_INTERVAL_MS=" +
                                  std::to_string(interval_ms));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  EXPECT_NE(stopped.output.find("stopping myself after step " + std::to_string(kCrashAfter)),
            std::string::npos)
      << stopped.output;
  EXPECT_NE(stopped.output.find("rank 1 (host "), std::string::npos) << stopped.output;
  EXPECT_NE(stopped.output.find("has not sent a heartbeat"), std::string::npos) << stopped.output;
  EXPECT_NE(stopped.output.find("resumed from step " + std::to_string(kCheckpointInterval) +
                                " (tdistrun restart 1)"),
            std::string::npos)
      << stopped.output;
  ASSERT_EQ(losses(stopped, "train").size(), static_cast<size_t>(kSteps))
      << slurp(dir + "/stopped/metrics.jsonl");
  std::cout << "heartbeat interval " << interval_ms
            << " ms: stopped rank named and the job resumed and finished in " << seconds << " s\n";
}

TEST(GptRestart, KilledRankResumesFromCheckpointWithTheSameFinalLoss) {
  const std::string dir = tdist::testing::make_temp_dir("gpt-restart");
  JobRun full = train(dir + "/full", "");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  JobRun crashed =
      train(dir + "/crashed", "TDIST_GPT_CRASH_AT_STEP=" + std::to_string(kCrashAfter));
  ASSERT_EQ(crashed.exit_code, 0) << crashed.output;

  // The fault really happened, and the second attempt resumed from the newest checkpoint.
  EXPECT_NE(crashed.output.find("killing myself after step " + std::to_string(kCrashAfter)),
            std::string::npos)
      << crashed.output;
  EXPECT_NE(crashed.output.find("resumed from step " + std::to_string(kCheckpointInterval) +
                                " (tdistrun restart 1)"),
            std::string::npos)
      << crashed.output;
  EXPECT_EQ(full.output.find("resumed from step"), std::string::npos) << full.output;

  // Every step logged exactly once, in order: nothing after the checkpoint lost or doubled.
  auto full_train = losses(full, "train");
  auto crashed_train = losses(crashed, "train");
  ASSERT_EQ(full_train.size(), static_cast<size_t>(kSteps)) << slurp(dir + "/full/metrics.jsonl");
  ASSERT_EQ(crashed_train.size(), static_cast<size_t>(kSteps))
      << slurp(dir + "/crashed/metrics.jsonl");
  // With tdist::checkpoint (the default build) the resumed run is the uninterrupted run,
  // bitwise, every step. The torch::save fallback (a build without tdist_checkpoint) still
  // drifts after the first resumed optimizer step; it is only bounded.
  const bool exact = crashed.output.find("checkpoints: tdist::checkpoint") != std::string::npos;
  double max_deviation = 0.0;
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(full_train[i].first, i + 1);
    EXPECT_EQ(crashed_train[i].first, i + 1);
    const double deviation = std::abs(crashed_train[i].second - full_train[i].second);
    max_deviation = std::max(max_deviation, deviation);
    if (exact || i + 1 <= kCheckpointInterval + 1) {
      // Up to the first step after the resume: bitwise (see the note at the top); step
      // kCheckpointInterval + 1 is computed from the restored parameters.
      EXPECT_EQ(crashed_train[i].second, full_train[i].second) << "step " << i + 1;
    } else {
      // KNOWN ISSUE (torch::save fallback build only): the runs drift apart from the first
      // optimizer step after the resume (~1e-3 relative by step 9).
      EXPECT_NEAR(crashed_train[i].second, full_train[i].second, 0.02 * full_train[i].second)
          << "step " << i + 1;
    }
  }
  std::cout << "largest |loss(crashed) - loss(uninterrupted)| over the steps: " << max_deviation
            << "\n";
  auto full_val = losses(full, "val");
  auto crashed_val = losses(crashed, "val");
  ASSERT_EQ(crashed_val.size(), full_val.size());
  for (size_t i = 0; i < full_val.size(); ++i) {
    EXPECT_EQ(crashed_val[i].first, full_val[i].first);
    EXPECT_NEAR(crashed_val[i].second, full_val[i].second, 0.02 * full_val[i].second)
        << "val at step " << full_val[i].first;
  }
  ASSERT_FALSE(full_val.empty());
  EXPECT_EQ(full_val.back().first, kSteps);
}

}  // namespace

namespace tdist::launch::testing {
namespace {

/// tdistrun for host `node` of two (one trainer each), no restart.
std::vector<std::string> trainer_node(const std::vector<std::string>& in_ns, int node,
                                      const std::string& master, int port,
                                      const std::string& run_dir) {
  std::vector<std::string> argv = in_ns;
  for (const std::string& a :
       {std::string(TDISTRUN_BIN), std::string("--nnodes"), std::string("2"),
        std::string("--nproc-per-node"), std::string("1"), std::string("--node-rank"),
        std::to_string(node), std::string("--master-addr"), master, std::string("--master-port"),
        std::to_string(port), std::string("--max-restarts"), std::string("0"),
        std::string("--stop-timeout"), std::string("3"), std::string("--rdzv-conf"),
        std::string("close_timeout=5"), std::string(TDIST_GPT_BIN)}) {
    argv.push_back(a);
  }
  for (const char* a : {"--mode",    "ddp",     "--n-layer",        "1",  "--n-head",       "2",
                        "--n-embd",  "16",      "--block-size",     "16", "--batch-size",   "2",
                        "--steps",   "1000000", "--eval-interval",  "0",  "--threads",      "1",
                        "--timeout", "120",     "--max-new-tokens", "0",  "--log-interval", "1",
                        "--run-dir"}) {
    argv.push_back(a);
  }
  argv.push_back(run_dir);
  return argv;
}

// A host whose traffic is dropped (a partition or a power loss: no reset, no error): the
// trainer on the other host names the rank that went silent within the heartbeats' silence:
// its collective raises the loss, the trainer ends, and its launcher ends the job. The
// cut-off host's launcher waits on the rendezvous store it no longer reaches (its keep-alives
// would end it after their own window); the test kills it, and its trainer, which no longer
// reaches rank 0's store either, ends through its own heartbeat.
TEST_F(NetnsPair, ACutOffHostIsNamedByHeartbeats) {
  if (access("/usr/sbin/nft", X_OK) != 0) {
    GTEST_SKIP() << "nft not installed: install Debian's nftables (tools/setup.sh does)";
  }
  const int port = 29556;  // each namespace has its own ports
  const std::string dir = tdist::testing::make_temp_dir("gpt-cut");
  const int interval_ms = tdist::testing::env_int("TDIST_HEARTBEAT_TEST_INTERVAL_MS", 200);
  const std::map<std::string, std::string> env = {
      {"TDIST_HEARTBEAT_INTERVAL_MS", std::to_string(interval_ms)}, {"OMP_NUM_THREADS", "1"}};
  Proc b(trainer_node(in_ns(1), 1, addr_[0], port, dir + "/b"), env);
  Proc a(trainer_node(in_ns(0), 0, addr_[0], port, dir + "/a"), env);
  // Training runs once rank 0 has logged a few steps.
  const auto started = std::chrono::steady_clock::now();
  while (read_file(dir + "/a/metrics.jsonl").size() < 300 &&
         std::chrono::steady_clock::now() - started < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(read_file(dir + "/a/metrics.jsonl").size(), 300u) << a.out_so_far();
  ASSERT_TRUE(cut_off(1)) << "nft could not drop host 1's traffic: " << cut_error_;
  const auto cut = std::chrono::steady_clock::now();
  // Host 0's rank names the silent one; its launcher then ends the job.
  const std::string named = "rank 1 (host ";
  while (a.err_so_far().find(named) == std::string::npos &&
         std::chrono::steady_clock::now() - cut < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  const ProcResult ra = a.wait(std::chrono::seconds(60));
  EXPECT_NE(ra.exit_code, 0) << describe(ra);
  EXPECT_NE(ra.err.find(named), std::string::npos) << describe(ra);
  EXPECT_NE(ra.err.find("has not sent a heartbeat"), std::string::npos) << describe(ra);
  // Its collective raised the loss (Note [Aborting on a lost peer]) and the trainer ended.
  EXPECT_NE(ra.err.find("process group is broken (rank 1 (host "), std::string::npos)
      << describe(ra);
  EXPECT_LT(seconds, interval_ms * 7 / 1000.0 + 1.0) << describe(ra);  // silence + 2 intervals
  // The cut-off host cannot tell anyone anything; its launcher is stopped here.
  b.kill(SIGKILL);
  b.wait(std::chrono::seconds(10));
  std::cout << "host 1 cut off: host 0's rank named rank 1 after " << seconds << " s\n";
}

}  // namespace
}  // namespace tdist::launch::testing

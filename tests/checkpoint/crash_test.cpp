// Crash consistency: ranks save a checkpoint after every "step", synchronously or
// asynchronously, until one of them is SIGKILLed at a random moment (staging, writing,
// committing, deleting old checkpoints) and the others right after, as a launcher's agent
// would. After each kill every directory that looks like a checkpoint must verify, data
// included, and the newest one must load (as a resumed run loads it, at another world size)
// and hold exactly its step's state.
//   TDIST_CRASH_TRIALS (default 12) trials; TDIST_CRASH_SEED picks the victims and moments.

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/helpers.h"
#include "support/ranks.h"
#include "tdist/checkpoint/checkpoint_manager.h"
#include "tdist/comm/distributed.h"

namespace tdist::checkpoint {
namespace {

using namespace tdist::checkpoint::testing;
namespace fs = std::filesystem;

constexpr int kKillWindowMs = 600;

/// Four 1 MiB tensors whose every element tells the step they were saved at.
std::map<std::string, at::Tensor> state_at_step(int64_t step) {
  std::map<std::string, at::Tensor> full;
  for (int i = 0; i < 4; ++i) {
    full["t" + std::to_string(i)] =
        at::arange(256 * 1024, at::kFloat).reshape({256, 1024}).add_(step * 10 + i);
  }
  return full;
}

TDIST_SCENARIO(ckpt_save_until_killed) {
  tdist::init_process_group(
      tdist::InitProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(20)));
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  if (rank == tdist::testing::env_int("CRASH_VICTIM", -1)) {
    const int delay_ms = tdist::testing::env_int("CRASH_DELAY_MS", 0);
    std::thread([delay_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      ::raise(SIGKILL);
    }).detach();
  }
  const bool async = tdist::testing::env_int("CRASH_ASYNC", 0) != 0;
  CheckpointManager manager(
      tdist::testing::env_str("CRASH_ROOT"),
      CheckpointManagerOptions().keep_last(2).save_options(SaveOptions().fsync(false)));
  for (int64_t step = 1; step < 100000; ++step) {
    ExtraState extra;
    extra.step = step;
    const auto state = shard_all(state_at_step(step), rank, world, Layout::kEven, false);
    if (async) {
      manager.async_save(step, state, extra);
    } else {
      manager.save(step, state, extra);
    }
  }
}

bool is_trash_name(const std::string& name) {
  return name.rfind(".trash-", 0) == 0;
}

struct TrialOutcome {
  bool partial_left = false;  // the kill interrupted a save
  int64_t loaded_step = -1;   // -1: no checkpoint was committed before the kill
};

TrialOutcome run_trial(int world, bool async, int victim, int delay_ms) {
  const std::string root = tdist::testing::make_temp_dir("crash") + "/ckpts";
  tdist::testing::ProcessOptions options;
  options.env = {{"CRASH_ROOT", root},
                 {"CRASH_ASYNC", async ? "1" : "0"},
                 {"CRASH_VICTIM", std::to_string(victim)},
                 {"CRASH_DELAY_MS", std::to_string(delay_ms)}};
  options.timeout = std::chrono::seconds(60);
  options.kill_all_when_one_is_killed = true;
  const auto results =
      tdist::testing::run_ranks_as_processes("ckpt_save_until_killed", world, options);
  for (const auto& r : results) {
    EXPECT_FALSE(r.timed_out) << "rank " << r.rank << " hung:\n" << r.output;
  }
  EXPECT_EQ(results[victim].signal, SIGKILL) << "the victim ended before its kill:\n"
                                             << results[victim].output;

  TrialOutcome outcome;
  CheckpointManager manager(
      root, CheckpointManagerOptions().coordinator(std::make_shared<LocalCoordinator>()));
  int64_t newest_complete = -1;
  for (const auto& entry : manager.list()) {
    if (entry.status == CheckpointStatus::kIncomplete &&
        is_partial_dir_name(fs::path(entry.path).filename().string())) {
      outcome.partial_left = true;
      continue;
    }
    const VerifyReport report = verify(entry.path, /*read_data=*/true);
    EXPECT_EQ(report.status, CheckpointStatus::kComplete)
        << "a directory that looks complete is not: " << entry.path << ": " << report.detail;
    newest_complete = std::max(newest_complete, entry.step);
  }
  if (fs::exists(root)) {
    for (const auto& name : list_dir(root)) {
      EXPECT_TRUE(name.rfind("step_", 0) == 0 || is_partial_dir_name(name) || is_trash_name(name))
          << "unexpected entry " << name;
    }
  }
  auto probe = shard_all(state_at_step(0), 0, 1, Layout::kWhole, true);
  const auto loaded = manager.load_latest(probe);
  if (loaded) {
    outcome.loaded_step = loaded->extra.step;
    EXPECT_EQ(loaded->extra.step, newest_complete);
    expect_matches_full(probe, state_at_step(loaded->extra.step),
                        "step " + std::to_string(loaded->extra.step));
  } else {
    EXPECT_EQ(newest_complete, -1) << "a complete checkpoint did not load";
  }
  return outcome;
}

TEST(CrashConsistency, ARankKilledAtRandomLeavesTheNewestCheckpointWhole) {
  const int trials = tdist::testing::env_int("TDIST_CRASH_TRIALS", 12);
  std::mt19937 rng(static_cast<uint32_t>(tdist::testing::env_int("TDIST_CRASH_SEED", 2026)));
  int interrupted = 0, resumable = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < trials; ++t) {
    const int world = 2 + t % 2;
    const bool async = (t / 2) % 2 == 1;
    const int victim = static_cast<int>(rng() % world);
    const int delay_ms = static_cast<int>(rng() % kKillWindowMs);
    SCOPED_TRACE("trial " + std::to_string(t) + ": world " + std::to_string(world) + ", " +
                 (async ? "async" : "sync") + " saves, rank " + std::to_string(victim) +
                 " killed after " + std::to_string(delay_ms) + " ms");
    const TrialOutcome o = run_trial(world, async, victim, delay_ms);
    interrupted += o.partial_left;
    resumable += o.loaded_step >= 0;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "crash consistency: %d kills, %d interrupted a save (a partial directory left), "
      "%d left a checkpoint to resume from, all verified; %.1f s\n",
      trials, interrupted, resumable, seconds);
  EXPECT_GT(resumable, 0) << "no trial committed a checkpoint before its kill: the kill window "
                             "is too short to test anything";
}

}  // namespace
}  // namespace tdist::checkpoint

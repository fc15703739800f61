// End to end with ranks as processes: resharding through the process group, and a rank
// SIGKILLed at every phase of a save.

#include <signal.h>

#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

#include "checkpoint/helpers.h"
#include "support/ranks.h"
#include "tdist/checkpoint/async_save.h"
#include "tdist/checkpoint/checkpoint.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace {

using namespace tdist::checkpoint::testing;
namespace fs = std::filesystem;

constexpr int kSeed = 31;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

void init_if_multi_rank() {
  if (tdist::testing::env_int("WORLD_SIZE", 1) > 1) {
    tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo").timeout(
        std::chrono::seconds(tdist::testing::env_int("CKPT_PG_TIMEOUT_S", 30))));
  }
}

// Saves reference_tensors(kSeed) at the launched world size, dim-0 uneven shards.
TDIST_SCENARIO(ckpt_save) {
  init_if_multi_rank();
  const int rank = tdist::testing::env_int("RANK", 0);
  const int world = tdist::testing::env_int("WORLD_SIZE", 1);
  ExtraState extra;
  extra.step = 500 + rank;
  save(shard_all(reference_tensors(kSeed), rank, world, Layout::kUneven, false), extra,
       env("CKPT_DIR"), SaveOptions().fsync(false));
  if (world > 1) tdist::destroy_process_group();
}

// Loads it back at the launched world size, even shards, and checks every byte.
TDIST_SCENARIO(ckpt_load) {
  init_if_multi_rank();
  const int rank = tdist::testing::env_int("RANK", 0);
  const int world = tdist::testing::env_int("WORLD_SIZE", 1);
  const auto full = reference_tensors(kSeed);
  auto target = shard_all(full, rank, world, Layout::kEven, true);
  const LoadResult r = load(target, env("CKPT_DIR"));
  expect_matches_full(target, full, "process load rank " + std::to_string(rank));
  EXPECT_EQ(r.saved_world_size, tdist::testing::env_int("CKPT_SAVED_WORLD", -1));
  if (world > 1) tdist::destroy_process_group();
}

// An asynchronous save through the default coordinator (the world's store) while the main
// thread runs training's collectives on the world group; the state changes right after
// save() returns.
TDIST_SCENARIO(ckpt_async_save) {
  init_if_multi_rank();
  const int rank = tdist::testing::env_int("RANK", 0);
  const int world = tdist::testing::env_int("WORLD_SIZE", 1);
  auto state = shard_all(reference_tensors(kSeed), rank, world, Layout::kUneven, false);
  const SaveFuture future = async_save(state, {}, env("CKPT_DIR"), SaveOptions().fsync(false));
  for (auto& [name, st] : state) st.local.zero_();
  for (int i = 0; i < 20; ++i) {
    const at::Tensor t = at::full({1024}, static_cast<double>(rank + 1));
    tdist::all_reduce(t);
    EXPECT_EQ(t[7].item<double>(), world * (world + 1) / 2.0);
  }
  future.wait();
  if (world > 1) tdist::destroy_process_group();
}

tdist::testing::ProcessOptions with_env(std::map<std::string, std::string> e) {
  tdist::testing::ProcessOptions o;
  o.env = std::move(e);
  o.timeout = std::chrono::seconds(90);
  return o;
}

TEST(Processes, SaveAtNLoadAtMThroughProcessGroups) {
  for (auto [n, m] : {std::pair{3, 2}, std::pair{2, 4}, std::pair{4, 1}, std::pair{1, 3}}) {
    SCOPED_TRACE("N=" + std::to_string(n) + " M=" + std::to_string(m));
    const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/ckpt";
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("ckpt_save", n, with_env({{"CKPT_DIR", dir}})));
    tdist::testing::expect_all_ok(tdist::testing::run_ranks_as_processes(
        "ckpt_load", m, with_env({{"CKPT_DIR", dir}, {"CKPT_SAVED_WORLD", std::to_string(n)}})));
  }
}

TEST(Processes, AsyncSaveBesideTrainingsCollectives) {
  const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/ckpt";
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("ckpt_async_save", 3, with_env({{"CKPT_DIR", dir}})));
  tdist::testing::expect_all_ok(tdist::testing::run_ranks_as_processes(
      "ckpt_load", 2, with_env({{"CKPT_DIR", dir}, {"CKPT_SAVED_WORLD", "3"}})));
}

// The process-group coordinator on a subgroup of ranks {0, 2}: binary messages of uneven
// lengths (one empty) come back whole and in group-rank order; rank 1, outside it, is refused.
TDIST_SCENARIO(ckpt_group_coordinator) {
  init_if_multi_rank();
  const int rank = tdist::get_rank();
  auto group = tdist::new_group({0, 2});
  if (rank == 1) {
    EXPECT_THROW(ProcessGroupCoordinator{group}, tdist::InvalidArgument);
  } else {
    ProcessGroupCoordinator coordinator(group);
    EXPECT_EQ(coordinator.world_size(), 2);
    auto message = [](int r) { return r == 0 ? std::string() : std::string("a\0b\xff", 4) + "c"; };
    for (int round = 0; round < 3; ++round) {
      const auto all = coordinator.all_gather(message(rank));
      EXPECT_EQ(all, (std::vector<std::string>{message(0), message(2)}));
    }
  }
  tdist::destroy_process_group();
}

TEST(Processes, AProcessGroupCoordinatorGathersOnItsGroupAndRefusesOutsiders) {
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("ckpt_group_coordinator", 3, with_env({})));
}

// A rank SIGKILLed at each phase: the previous checkpoint still loads, the new one is
// invisible (or, killed after the commit point, complete) and never half-loaded.
void kill_at_every_phase(int world) {
  const SavePhase phases[] = {SavePhase::kPlan,     SavePhase::kWrite,  SavePhase::kAfterWrite,
                              SavePhase::kMetadata, SavePhase::kCommit, SavePhase::kAfterCommit};
  for (SavePhase phase : phases) {
    const bool commit_phase = phase == SavePhase::kMetadata || phase == SavePhase::kCommit ||
                              phase == SavePhase::kAfterCommit;
    const int victim = commit_phase ? 0 : world - 1;
    SCOPED_TRACE("world " + std::to_string(world) + ", rank " + std::to_string(victim) +
                 " killed at " + to_string(phase));
    const std::string root = tdist::testing::make_temp_dir("ckpt");
    const auto previous = reference_tensors(3);
    save(shard_all(previous, 0, 1, Layout::kWhole, false), {}, root + "/prev");

    const std::string fault = std::to_string(victim) + ":" + to_string(phase) + ":kill";
    auto results =
        tdist::testing::run_ranks_as_processes("ckpt_save", world,
                                               with_env({{"CKPT_DIR", root + "/next"},
                                                         {"TDIST_CHECKPOINT_FAULT", fault},
                                                         {"CKPT_PG_TIMEOUT_S", "5"}}));
    EXPECT_EQ(results[victim].signal, SIGKILL) << results[victim].output;
    for (int r = 0; r < world; ++r) {
      EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
      if (r != victim && phase != SavePhase::kAfterCommit) {
        EXPECT_FALSE(results[r].ok()) << "rank " << r << " reported success";
      }
    }

    auto target = shard_all(previous, 0, 1, Layout::kWhole, true);
    load(target, root + "/prev");
    expect_matches_full(target, previous, "previous checkpoint");
    const CheckpointStatus next = verify(root + "/next").status;
    if (phase == SavePhase::kAfterCommit) {
      EXPECT_EQ(next, CheckpointStatus::kComplete);
    } else {
      EXPECT_EQ(next, CheckpointStatus::kMissing) << "a killed save became visible";
      // Whatever the kill left behind is hidden and reported as incomplete.
      for (const auto& name : list_dir(root)) {
        if (name == "prev") continue;
        EXPECT_TRUE(is_partial_dir_name(name)) << name;
        EXPECT_EQ(verify(root + "/" + name).status, CheckpointStatus::kIncomplete);
      }
    }
  }
}

TEST(Processes, KilledMidSaveSingleRank) {
  kill_at_every_phase(1);
}

TEST(Processes, KilledMidSaveThreeRanks) {
  kill_at_every_phase(3);
}

}  // namespace
}  // namespace tdist::checkpoint

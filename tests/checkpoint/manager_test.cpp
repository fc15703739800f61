// CheckpointManager: retention of the last K, resume from the newest valid checkpoint.

#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include "checkpoint/helpers.h"
#include "support/ranks.h"
#include "tdist/checkpoint/checkpoint_manager.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace {

using namespace tdist::checkpoint::testing;
namespace fs = std::filesystem;

CheckpointManagerOptions fast(int keep) {
  return CheckpointManagerOptions().keep_last(keep).save_options(SaveOptions().fsync(false));
}

ExtraState at_step(int64_t step) {
  ExtraState e;
  e.step = step;
  return e;
}

TEST(CheckpointManager, KeepsTheLastK) {
  const std::string root = tdist::testing::make_temp_dir("mgr");
  CheckpointManager manager(root, fast(2));
  for (int step = 10; step <= 40; step += 10) {
    manager.save(step, shard_all(reference_tensors(step), 0, 1, Layout::kWhole, false),
                 at_step(step));
  }
  const auto entries = manager.list();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].step, 30);
  EXPECT_EQ(entries[1].step, 40);
  EXPECT_EQ(list_dir(root), (std::vector<std::string>{"step_00000030", "step_00000040"}));

  auto state = shard_all(reference_tensors(40), 0, 1, Layout::kWhole, true);
  const auto r = manager.load_latest(state);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->extra.step, 40);
  expect_matches_full(state, reference_tensors(40), "latest");
}

// A crash between moving an old checkpoint out of sight and deleting it leaves a .trash-
// directory; the next save's retention finishes the deletion.
TEST(CheckpointManager, FinishesADeletionACrashInterrupted) {
  const std::string root = tdist::testing::make_temp_dir("mgr");
  fs::create_directories(root + "/.trash-step_00000001/sub");
  std::fclose(std::fopen((root + "/.trash-step_00000001/sub/shard-00000.bin").c_str(), "w"));
  CheckpointManager manager(root, fast(2));
  manager.save(2, shard_all(reference_tensors(2), 0, 1, Layout::kWhole, false), at_step(2));
  EXPECT_EQ(list_dir(root), std::vector<std::string>{"step_00000002"});
}

TEST(CheckpointManager, ResumesFromNewestValidSkippingBrokenOnes) {
  const std::string root = tdist::testing::make_temp_dir("mgr");
  CheckpointManager manager(root, fast(5));
  for (int step : {1, 2, 3}) {
    manager.save(step, shard_all(reference_tensors(7), 0, 1, Layout::kWhole, false), at_step(step));
  }
  // Step 3: a flipped data byte (caught during the load); step 4: a save killed before
  // commit (hidden partial directory); step 5: a directory without metadata.
  const std::string shard3 = find_file(manager.path_for(3), "shard-");
  const CheckpointMetadata m3 = read_metadata(manager.path_for(3));
  const ChunkInfo& c = m3.tensors.at("layers.0.weight").chunks.at(0);
  flip_byte(shard3, c.byte_offset + 3);
  fs::create_directories(root + "/.step_00000004.partial-abc");
  fs::create_directories(manager.path_for(5));

  const auto entries = manager.list();
  ASSERT_EQ(entries.size(), 5u);
  EXPECT_EQ(entries[3].status, CheckpointStatus::kIncomplete);  // partial step 4
  EXPECT_EQ(entries[4].status, CheckpointStatus::kIncomplete);  // step 5, no metadata

  auto state = shard_all(reference_tensors(7), 0, 1, Layout::kWhole, true);
  auto r = manager.load_latest(state);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->extra.step, 2) << "should skip corrupt step 3";
  expect_matches_full(state, reference_tensors(7), "resumed");

  // verify_before_load rejects step 3 without attempting it, same answer.
  CheckpointManager verifying(root, fast(5).verify_before_load(true));
  r = verifying.load_latest(state);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->extra.step, 2);

  // A new save cleans up the broken leftovers older than it.
  manager.save(6, shard_all(reference_tensors(7), 0, 1, Layout::kWhole, false), at_step(6));
  for (const auto& e : manager.list()) {
    EXPECT_TRUE(e.status == CheckpointStatus::kComplete) << e.path << " " << e.detail;
  }
}

TEST(CheckpointManager, NothingValidMeansFreshStart) {
  const std::string root = tdist::testing::make_temp_dir("mgr");
  CheckpointManager manager(root + "/not-yet", fast(2));
  ShardedStateDict state{{"w", ShardedTensor::whole(at::zeros({3}))}};
  EXPECT_FALSE(manager.load_latest(state).has_value());
  EXPECT_THROW(CheckpointManager(root, fast(0)), InvalidArgument);
}

TEST(CheckpointManager, RankThreadsAgreeOnTheCheckpointToLoad) {
  const std::string root = tdist::testing::make_temp_dir("mgr");
  const auto full = reference_tensors(8);
  run_with_coordinators(2, [&](int rank, CoordinatorPtr c) {
    CheckpointManager manager(root, fast(2).coordinator(c));
    for (int step : {5, 6, 7}) {
      manager.save(step, shard_all(full, rank, 2, Layout::kEven, false), at_step(step));
    }
  });
  EXPECT_EQ(list_dir(root).size(), 2u);
  run_with_coordinators(3, [&](int rank, CoordinatorPtr c) {
    CheckpointManager manager(root, fast(2).coordinator(c));
    auto state = shard_all(full, rank, 3, Layout::kUneven, true);
    const auto r = manager.load_latest(state);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->extra.step, 7);
    expect_matches_full(state, full, "rank " + std::to_string(rank));
  });
}

}  // namespace
}  // namespace tdist::checkpoint

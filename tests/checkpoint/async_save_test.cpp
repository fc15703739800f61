// Asynchronous saves: what is saved is the state when save() returned, one save at a time,
// failures on every rank's future and on the next save, retention after the commit.

#include <atomic>
#include <filesystem>

#include <gtest/gtest.h>

#include "checkpoint/helpers.h"
#include "support/ranks.h"
#include "tdist/checkpoint/async_save.h"
#include "tdist/checkpoint/checkpoint_manager.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/store/hash_store.h"

namespace tdist::checkpoint {
namespace {

using namespace tdist::checkpoint::testing;
namespace fs = std::filesystem;

SaveOptions fast() {
  return SaveOptions().fsync(false);
}

bool mentions(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void add_one_in_place(ShardedStateDict& state) {
  for (auto& [name, st] : state) {
    if (st.local.numel() > 0 && st.local.scalar_type() != at::kBool) st.local.add_(1);
  }
}

std::string error_of(const SaveFuture& future) {
  try {
    future.wait();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

// The state changes as soon as save() returns; the checkpoint holds it as it was then, at
// odd and even world sizes.
TEST(AsyncSave, SavesTheStateAsItWasWhenSaveReturned) {
  const auto full = reference_tensors(41);
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const std::string dir = tdist::testing::make_temp_dir("async") + "/ckpt";
    run_with_coordinators(world, [&](int rank, CoordinatorPtr coord) {
      AsyncCheckpointer checkpointer(coord);
      auto state = shard_all(full, rank, world, Layout::kUneven, false);
      ExtraState extra;
      extra.step = 7;
      const SaveFuture future = checkpointer.save(state, extra, dir, fast());
      EXPECT_EQ(future.path(), dir);
      add_one_in_place(state);  // training goes on
      future.wait();
      EXPECT_TRUE(future.done());
    });
    EXPECT_EQ(verify(dir).status, CheckpointStatus::kComplete);
    auto target = shard_all(full, 0, 1, Layout::kWhole, true);
    const LoadResult r = load(target, dir);
    expect_matches_full(target, full, "async save");
    EXPECT_EQ(r.saved_world_size, world);
    EXPECT_EQ(r.extra.step, 7);
  }
}

// Saves in a row: each waits for the one before, and stages into the same host buffers.
TEST(AsyncSave, SavesInARowReuseTheStagingMemory) {
  const std::string root = tdist::testing::make_temp_dir("async");
  const int world = 2;
  run_with_coordinators(world, [&](int rank, CoordinatorPtr coord) {
    AsyncCheckpointer checkpointer(coord);
    auto state = shard_all(reference_tensors(50), rank, world, Layout::kEven, false);
    int64_t state_bytes = 0;
    for (const auto& [name, st] : state) state_bytes += st.local.nbytes();
    std::vector<SaveFuture> futures;
    for (int i = 0; i < 3; ++i) {
      futures.push_back(checkpointer.save(state, {}, root + "/s" + std::to_string(i), fast()));
      EXPECT_EQ(checkpointer.staged_bytes(), state_bytes);
      // The previous save is finished once the next one has returned.
      if (i > 0) {
        EXPECT_TRUE(futures[i - 1].done());
      }
      add_one_in_place(state);
    }
    checkpointer.wait();
    for (const auto& f : futures) EXPECT_NO_THROW(f.wait());
  });
  for (int i = 0; i < 3; ++i) {
    auto expected = reference_tensors(50);
    for (auto& [name, t] : expected) {
      // One add per save, as the ranks did: x + 1 + 1 need not round to x + 2.
      if (t.numel() > 0 && t.scalar_type() != at::kBool) {
        for (int k = 0; k < i; ++k) t.add_(1);
      }
    }
    auto target = shard_all(expected, 0, 1, Layout::kWhole, true);
    load(target, root + "/s" + std::to_string(i));
    expect_matches_full(target, expected, "save " + std::to_string(i));
  }
}

// A write failure on one rank fails every rank's future, and the next save reports it
// (unless wait() did) instead of starting; the save after that works.
TEST(AsyncSave, FailureReachesEveryFutureAndTheNextSave) {
  const int world = 3;
  const std::string root = tdist::testing::make_temp_dir("async");
  std::atomic<int> future_errors{0}, next_save_errors{0};
  run_with_coordinators(world, [&](int rank, CoordinatorPtr coord) {
    AsyncCheckpointer checkpointer(coord);
    const auto state = shard_all(reference_tensors(60), rank, world, Layout::kEven, false);
    const SaveFuture failing = checkpointer.save(
        state, {}, root + "/bad", fast().fault(FaultInjection{1, SavePhase::kWrite, false}));
    const std::string error = error_of(failing);
    if (mentions(error, "rank(s) 1") && mentions(error, "phase write")) ++future_errors;
    try {
      checkpointer.save(state, {}, root + "/next", fast());
    } catch (const CheckpointError& e) {
      if (mentions(e.what(), "previous asynchronous save failed") &&
          mentions(e.what(), "rank(s) 1")) {
        ++next_save_errors;
      }
    }
    checkpointer.save(state, {}, root + "/good", fast()).wait();
  });
  EXPECT_EQ(future_errors.load(), world);
  EXPECT_EQ(next_save_errors.load(), world);
  EXPECT_EQ(list_dir(root), std::vector<std::string>{"good"}) << "partial save left behind";
}

TEST(AsyncSave, WaitReportsAFailureOnce) {
  const std::string root = tdist::testing::make_temp_dir("async");
  AsyncCheckpointer checkpointer(std::make_shared<LocalCoordinator>());
  const ShardedStateDict state = {{"w", ShardedTensor::whole(at::ones({8}))}};
  checkpointer.save(state, {}, root + "/a", fast().fault(FaultInjection{0, SavePhase::kPlan}));
  EXPECT_THROW(checkpointer.wait(), CheckpointError);
  EXPECT_NO_THROW(checkpointer.wait());
  EXPECT_NO_THROW(checkpointer.save(state, {}, root + "/b", fast()).wait());
  EXPECT_EQ(list_dir(root), std::vector<std::string>{"b"});
}

// A rank that cannot stage (here a tensor with no data) still joins the save, so every rank
// fails at once, naming it, instead of waiting for it.
TEST(AsyncSave, StagingFailureOnOneRankFailsEveryRank) {
  const int world = 3;
  const std::string dir = tdist::testing::make_temp_dir("async") + "/ckpt";
  std::atomic<int> named{0};
  run_with_coordinators(world, [&](int rank, CoordinatorPtr coord) {
    AsyncCheckpointer checkpointer(coord);
    auto state = shard_all(reference_tensors(70), rank, world, Layout::kEven, false);
    if (rank == 2) {
      const auto& st = state.begin()->second;
      state.begin()->second.local =
          at::empty(st.local.sizes(), st.local.options().device(at::kMeta));
    }
    const std::string error = error_of(checkpointer.save(state, {}, dir, fast()));
    if (mentions(error, "rank(s) 2") && mentions(error, "staging")) ++named;
  });
  EXPECT_EQ(named.load(), world);
  EXPECT_FALSE(fs::exists(dir));
}

TEST(AsyncSave, RefusesTheDefaultGroupsCollectives) {
  tdist::init_process_group(tdist::InitProcessGroupOptions()
                                .backend("gloo")
                                .store(std::make_shared<HashStore>())
                                .rank(0)
                                .world_size(1));
  AsyncCheckpointer checkpointer(std::make_shared<ProcessGroupCoordinator>());
  try {
    checkpointer.save({{"w", ShardedTensor::whole(at::ones({2}))}}, {},
                      tdist::testing::make_temp_dir("async") + "/c", fast());
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(mentions(e.what(), "new_group")) << e.what();
  }
  // Unset, the coordinator is a store-based one; at world size 1 a local one.
  const std::string dir = tdist::testing::make_temp_dir("async") + "/c";
  async_save({{"w", ShardedTensor::whole(at::ones({2}))}}, {}, dir, fast()).wait();
  EXPECT_EQ(verify(dir).status, CheckpointStatus::kComplete);
  tdist::destroy_process_group();
}

// CheckpointManager::async_save keeps the last K once each save has committed, and
// load_latest waits for the save in flight.
TEST(AsyncSave, ManagerAppliesRetentionAfterEachCommit) {
  const std::string root = tdist::testing::make_temp_dir("async");
  const int world = 2;
  run_with_coordinators(world, [&](int rank, CoordinatorPtr coord) {
    CheckpointManager manager(
        root, CheckpointManagerOptions().keep_last(2).coordinator(coord).save_options(fast()));
    for (int step = 1; step <= 4; ++step) {
      ExtraState extra;
      extra.step = step;
      manager.async_save(
          step, shard_all(reference_tensors(step), rank, world, Layout::kEven, false), extra);
    }
    auto state = shard_all(reference_tensors(4), rank, world, Layout::kEven, true);
    const auto r = manager.load_latest(state);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->extra.step, 4);
    expect_matches_full(state, reference_tensors(4), "latest after async saves");
  });
  EXPECT_EQ(list_dir(root), (std::vector<std::string>{"step_00000003", "step_00000004"}));
}

}  // namespace
}  // namespace tdist::checkpoint

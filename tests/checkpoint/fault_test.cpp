// Corruption and injected failures: every flipped byte is caught naming the file, a failing
// rank fails every rank's save naming it, and a failed save never becomes visible.

#include <atomic>
#include <filesystem>

#include <gtest/gtest.h>

#include "checkpoint/helpers.h"
#include "support/ranks.h"
#include "tdist/checkpoint/checkpoint.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace {

using namespace tdist::checkpoint::testing;
namespace fs = std::filesystem;

std::string saved_checkpoint(const std::map<std::string, at::Tensor>& full) {
  const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/ckpt";
  save(shard_all(full, 0, 1, Layout::kWhole, false), {}, dir,
       SaveOptions().checksum_block_bytes(128).fsync(false));
  return dir;
}

void expect_load_error_naming(const std::string& dir, const std::map<std::string, at::Tensor>& full,
                              const std::string& needle) {
  auto target = shard_all(full, 0, 1, Layout::kWhole, true);
  try {
    load(target, dir);
    ADD_FAILURE() << "load of a damaged checkpoint succeeded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Corruption, FlippedDataByteNamesTheFile) {
  const auto full = reference_tensors(11);
  const std::string dir = saved_checkpoint(full);
  const std::string shard = find_file(dir, "shard-");
  ASSERT_FALSE(shard.empty());
  const int64_t size = static_cast<int64_t>(fs::file_size(shard));
  // Several positions: first byte, middle, last byte.
  for (int64_t offset : {int64_t(0), size / 2, size - 1}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    const std::string copy = tdist::testing::make_temp_dir("ckpt") + "/copy";
    fs::copy(dir, copy);
    const std::string bad = find_file(copy, "shard-");
    flip_byte(bad, offset);
    const VerifyReport report = verify(copy);
    EXPECT_EQ(report.status, CheckpointStatus::kCorrupt);
    EXPECT_NE(report.detail.find(bad), std::string::npos) << report.detail;
    // Either the padding or a tensor: a full load reads every block that holds data;
    // padding bytes are covered by verify() above.
    auto target = shard_all(full, 0, 1, Layout::kWhole, true);
    try {
      load(target, copy);
      // Only acceptable if the flipped byte was alignment padding between chunks.
      expect_matches_full(target, full, "padding flip");
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  // The intact original still verifies.
  EXPECT_EQ(verify(dir).status, CheckpointStatus::kComplete);
}

TEST(Corruption, FlippedByteInsideATensorFailsTheLoad) {
  const auto full = reference_tensors(12);
  const std::string dir = saved_checkpoint(full);
  const CheckpointMetadata m = read_metadata(dir);
  const ChunkInfo& chunk = m.tensors.at("layers.1.weight").chunks.at(0);
  const std::string file = (fs::path(dir) / chunk.file).string();
  flip_byte(file, chunk.byte_offset + chunk.byte_length / 2);
  expect_load_error_naming(dir, full, file);
  // With verification off the load "succeeds" with wrong data: the checksum is what caught it.
  auto target = shard_all(full, 0, 1, Layout::kWhole, true);
  load(target, dir, LoadOptions().verify(false));
  at::Tensor expected = full.at("layers.1.weight");
  EXPECT_FALSE(bitwise_equal(target.at("layers.1.weight").local, expected));
}

TEST(Corruption, TruncatedOrMissingFileNamesIt) {
  const auto full = reference_tensors(13);
  const std::string dir = saved_checkpoint(full);
  const std::string shard = find_file(dir, "shard-");
  fs::resize_file(shard, fs::file_size(shard) - 10);
  expect_load_error_naming(dir, full, shard);
  EXPECT_EQ(verify(dir, false).status, CheckpointStatus::kCorrupt);
  fs::remove(shard);
  expect_load_error_naming(dir, full, shard);
}

TEST(Corruption, FlippedMetadataByteNamesTheMetadata) {
  const auto full = reference_tensors(14);
  const std::string dir = saved_checkpoint(full);
  const std::string meta = (fs::path(dir) / kMetadataFile).string();
  flip_byte(meta, static_cast<int64_t>(fs::file_size(meta)) / 2);
  expect_load_error_naming(dir, full, meta);
  EXPECT_EQ(verify(dir).status, CheckpointStatus::kCorrupt);
}

TEST(Corruption, DirectoryWithoutMetadataIsIncomplete) {
  const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/half";
  fs::create_directories(dir);
  EXPECT_EQ(verify(dir).status, CheckpointStatus::kIncomplete);
  EXPECT_EQ(verify(dir + "-absent").status, CheckpointStatus::kMissing);
  ShardedStateDict s{{"w", ShardedTensor::whole(at::zeros({2}))}};
  EXPECT_THROW(load(s, dir), CheckpointError);
}

struct InjectionCase {
  int rank;
  SavePhase phase;
};

// A failure at any phase on any rank fails every rank's save, names the rank, leaves the
// previous checkpoint loadable and nothing half-written visible.
TEST(FaultInjection, AnyRankAnyPhaseFailsEveryRank) {
  const int world = 3;
  const auto before = reference_tensors(20), after = reference_tensors(21);
  std::vector<InjectionCase> cases;
  for (SavePhase p : {SavePhase::kPlan, SavePhase::kWrite, SavePhase::kAfterWrite}) {
    for (int r = 0; r < world; ++r) cases.push_back({r, p});
  }
  for (SavePhase p : {SavePhase::kMetadata, SavePhase::kCommit, SavePhase::kAfterCommit}) {
    cases.push_back({0, p});
  }
  for (const auto& c : cases) {
    SCOPED_TRACE("rank " + std::to_string(c.rank) + " phase " + to_string(c.phase));
    const std::string root = tdist::testing::make_temp_dir("ckpt");
    const std::string prev = root + "/prev", next = root + "/next";
    std::atomic<int> failed{0};
    run_with_coordinators(world, [&](int rank, CoordinatorPtr coord) {
      auto opts = SaveOptions().coordinator(coord).fsync(false).checksum_block_bytes(64);
      save(shard_all(before, rank, world, Layout::kEven, false), {}, prev, opts);
      try {
        save(shard_all(after, rank, world, Layout::kEven, false), {}, next,
             opts.fault(FaultInjection{c.rank, c.phase, false}));
      } catch (const CheckpointError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("rank(s) " + std::to_string(c.rank)), std::string::npos) << msg;
        EXPECT_NE(msg.find("phase " + to_string(c.phase)), std::string::npos) << msg;
        ++failed;
      }
    });
    EXPECT_EQ(failed.load(), world) << "every rank's save must fail";
    auto target = shard_all(before, 0, 1, Layout::kWhole, true);
    load(target, prev);
    expect_matches_full(target, before, "previous checkpoint");
    if (c.phase == SavePhase::kAfterCommit) {
      // The failure came after the commit point: the new checkpoint is whole and loads.
      EXPECT_EQ(verify(next).status, CheckpointStatus::kComplete);
      EXPECT_EQ(list_dir(root), (std::vector<std::string>{"next", "prev"}));
    } else {
      EXPECT_EQ(list_dir(root), std::vector<std::string>{"prev"}) << "partial save left behind";
    }
  }
}

TEST(FaultInjection, AbsentRankTimesOutInsteadOfHanging) {
  const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/ckpt";
  std::atomic<int> failed{0};
  run_with_coordinators(
      3,
      [&](int rank, CoordinatorPtr coord) {
        if (rank == 2) return;  // never calls save
        try {
          save({{"w", ShardedTensor::whole(at::ones({4}))}}, {}, dir,
               SaveOptions().coordinator(coord).fsync(false));
        } catch (const CheckpointError& e) {
          EXPECT_NE(std::string(e.what()).find("2"), std::string::npos) << e.what();
          ++failed;
        }
      },
      std::chrono::milliseconds(500));
  EXPECT_EQ(failed.load(), 2);
  EXPECT_FALSE(fs::exists(dir));
}

}  // namespace
}  // namespace tdist::checkpoint

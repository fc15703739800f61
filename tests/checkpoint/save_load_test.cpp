// Round trips and resharding: save at world size N, load at M, every layout, bitwise.

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

SaveOptions fast_save(CoordinatorPtr c) {
  // Tiny checksum blocks so the read-amplification bound below is tight; no fsync in tests.
  return SaveOptions().coordinator(std::move(c)).checksum_block_bytes(64).fsync(false);
}

TEST(SaveLoad, SingleRankRoundTripWithExtraState) {
  const auto full = reference_tensors(1);
  const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/c";
  ExtraState extra;
  extra.step = 1234;
  extra.data_position = 77;
  extra.rng_states["torch.cpu"] = capture_torch_rng_state();
  extra.user["schedule"] = {{"lr", 3e-4}, {"warmup", 100}};
  save(shard_all(full, 0, 1, Layout::kWhole, false), extra, dir);
  EXPECT_TRUE(fs::exists(fs::path(dir) / kMetadataFile));

  auto target = shard_all(full, 0, 1, Layout::kWhole, true);
  const LoadResult r = load(target, dir);
  expect_matches_full(target, full, "world 1");
  EXPECT_TRUE(r.extra == extra);
  EXPECT_EQ(r.saved_world_size, 1);
  EXPECT_TRUE(r.unexpected_keys.empty());
  EXPECT_EQ(verify(dir).status, CheckpointStatus::kComplete);
  // Nothing else is left next to the checkpoint (no partial directories).
  EXPECT_EQ(list_dir(fs::path(dir).parent_path().string()), std::vector<std::string>{"c"});
}

TEST(SaveLoad, RngStateRestores) {
  const auto state = capture_torch_rng_state();
  const at::Tensor a = at::randn({8});
  restore_torch_rng_state(state);
  EXPECT_TRUE(bitwise_equal(a, at::randn({8})));
}

// Every (N, M) in 1..4 x 1..4, saving and loading in different layouts.
TEST(SaveLoad, ReshardsAcrossWorldSizesAndLayouts) {
  expect_reshards_every_world_pair(reference_tensors(2), fast_save,
                                   {Layout::kUneven, Layout::kEven, Layout::kDim1, Layout::kWhole});
}

TEST(SaveLoad, ReplicatedTensorsAreWrittenOnceAndSpreadOverRanks) {
  const auto full = reference_tensors(3);
  const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/ckpt";
  run_with_coordinators(3, [&](int rank, CoordinatorPtr c) {
    save(shard_all(full, rank, 3, Layout::kWhole, false), {}, dir, fast_save(c));
  });
  const CheckpointMetadata m = read_metadata(dir);
  int64_t full_bytes = 0;
  for (const auto& [name, t] : full) full_bytes += t.nbytes();
  int64_t saved_bytes = 0;
  for (const auto& [name, info] : m.tensors) {
    ASSERT_LE(info.chunks.size(), 1u) << name << " written more than once";
    for (const auto& c : info.chunks) saved_bytes += c.byte_length;
  }
  EXPECT_EQ(saved_bytes, full_bytes);
  EXPECT_GE(m.files.size(), 2u) << "all replicated tensors went to one rank";
}

TEST(SaveLoad, EachRankReadsOnlyItsOverlap) {
  // One big tensor saved in 4 row shards; a rank loading 1/4 of it at world 4 with a
  // different split must read about 1/4 of the data, not all of it.
  std::map<std::string, at::Tensor> full{{"w", at::randn({400, 16})}};
  const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/ckpt";
  run_with_coordinators(4, [&](int rank, CoordinatorPtr c) {
    save(shard_all(full, rank, 4, Layout::kEven, false), {}, dir, fast_save(c));
  });
  run_with_coordinators(4, [&](int rank, CoordinatorPtr c) {
    auto target = shard_all(full, rank, 4, Layout::kUneven, true);
    const LoadResult r = load(target, dir, LoadOptions().coordinator(c));
    expect_matches_full(target, full, "uneven");
    const int64_t wanted = target.at("w").local.nbytes();
    // Each saved chunk met contributes at most 2 partial 64-byte blocks of extra reading.
    EXPECT_LE(r.bytes_read, wanted + 4 * 2 * 64) << "rank " << rank;
    EXPECT_GE(r.bytes_read, wanted);
  });
}

TEST(SaveLoad, LoadChecksShapesDtypesAndMissingKeys) {
  const auto full = reference_tensors(4);
  const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/ckpt";
  save(shard_all(full, 0, 1, Layout::kWhole, false), {}, dir);

  ShardedStateDict wrong_shape{{"layers.0.bias", ShardedTensor::whole(at::zeros({8}))}};
  try {
    load(wrong_shape, dir);
    FAIL() << "expected a shape error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.bias"), std::string::npos) << e.what();
  }
  ShardedStateDict wrong_dtype{
      {"layers.0.bias", ShardedTensor::whole(at::zeros({7}, at::kDouble))}};
  EXPECT_THROW(load(wrong_dtype, dir), CheckpointError);

  ShardedStateDict extra_key{{"not.saved", ShardedTensor::whole(at::zeros({2}))},
                             {"layers.0.bias", ShardedTensor::whole(at::zeros({7}))}};
  try {
    load(extra_key, dir);
    FAIL() << "expected a missing-key error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("not.saved"), std::string::npos) << e.what();
  }
  ShardedStateDict two_extra_keys{{"also.not.saved", ShardedTensor::whole(at::zeros({2}))},
                                  {"not.saved", ShardedTensor::whole(at::zeros({2}))}};
  try {
    load(two_extra_keys, dir);
    FAIL() << "expected a missing-key error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("has no tensor named also.not.saved, not.saved ("),
              std::string::npos)
        << e.what();
  }
  const LoadResult r = load(extra_key, dir, LoadOptions().strict(false));
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"not.saved"});
  EXPECT_TRUE(bitwise_equal(extra_key.at("layers.0.bias").local, full.at("layers.0.bias")));
  EXPECT_EQ(r.unexpected_keys.size(), full.size() - 1);
}

TEST(SaveLoad, RefusesToOverwriteUnlessAsked) {
  const auto a = reference_tensors(5), b = reference_tensors(6);
  const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/ckpt";
  save(shard_all(a, 0, 1, Layout::kWhole, false), {}, dir);
  EXPECT_THROW(save(shard_all(b, 0, 1, Layout::kWhole, false), {}, dir), CheckpointError);
  save(shard_all(b, 0, 1, Layout::kWhole, false), {}, dir, SaveOptions().overwrite(true));
  auto target = shard_all(b, 0, 1, Layout::kWhole, true);
  load(target, dir);
  expect_matches_full(target, b, "overwritten");
  EXPECT_EQ(list_dir(fs::path(dir).parent_path().string()), std::vector<std::string>{"ckpt"});
}

TEST(SaveLoad, InconsistentShardsFailOnEveryRank) {
  // Rank 1 claims a different global shape: every rank must fail, naming the tensor.
  const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/ckpt";
  std::atomic<int> failures{0};
  run_with_coordinators(2, [&](int rank, CoordinatorPtr c) {
    ShardedStateDict s{
        {"w", ShardedTensor{at::zeros({2, 3}), {rank == 1 ? 5 : 4, 3}, {rank * 2, 0}}}};
    try {
      save(s, {}, dir, fast_save(c));
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
      ++failures;
    }
  });
  EXPECT_EQ(failures.load(), 2);
  EXPECT_TRUE(list_dir(fs::path(dir).parent_path().string()).empty());

  // A missing shard (rank 1 holds nothing) is also caught before anything is written.
  failures = 0;
  run_with_coordinators(2, [&](int rank, CoordinatorPtr c) {
    ShardedStateDict s{{"w", ShardedTensor{at::zeros({rank == 0 ? 2 : 0, 3}), {4, 3}, {0, 0}}}};
    try {
      save(s, {}, dir, fast_save(c));
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
      ++failures;
    }
  });
  EXPECT_EQ(failures.load(), 2);
}

}  // namespace
}  // namespace tdist::checkpoint

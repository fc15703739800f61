// Pure arithmetic: bucket assignment and ZeRO partitioning.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tdist/ddp/zero_redundancy_optimizer.h"
#include "tdist/detail/ddp/bucketing.h"
#include "tdist/error.h"

using tdist::ddp::BucketEntry;
using tdist::ddp::compute_bucket_assignment_by_size;
using Buckets = std::vector<std::vector<size_t>>;

TEST(Bucketing, FirstBucketUsesFirstLimitThenTheRest) {
  // 10 tensors of 100 bytes: first bucket closes at >= 150 (2 tensors), then >= 350 (4).
  std::vector<BucketEntry> entries(10, BucketEntry{100, 0});
  auto buckets = compute_bucket_assignment_by_size(entries, {150, 350});
  EXPECT_EQ(buckets, (Buckets{{0, 1}, {2, 3, 4, 5}, {6, 7, 8, 9}}));
}

TEST(Bucketing, LeftoverBucketIsKept) {
  std::vector<BucketEntry> entries(5, BucketEntry{100, 0});
  auto buckets = compute_bucket_assignment_by_size(entries, {300});
  EXPECT_EQ(buckets, (Buckets{{0, 1, 2}, {3, 4}}));
}

TEST(Bucketing, OversizedTensorGetsItsOwnBucket) {
  std::vector<BucketEntry> entries{{10, 0}, {1000, 0}, {10, 0}};
  auto buckets = compute_bucket_assignment_by_size(entries, {100});
  EXPECT_EQ(buckets, (Buckets{{0, 1}, {2}}));
}

TEST(Bucketing, DtypesNeverShareABucket) {
  std::vector<at::Tensor> tensors{torch::zeros({4}), torch::zeros({4}, torch::kDouble),
                                  torch::zeros({4}), torch::zeros({4}, torch::kDouble)};
  auto buckets = compute_bucket_assignment_by_size(tensors, {1 << 20});
  EXPECT_EQ(buckets, (Buckets{{0, 2}, {1, 3}}));
}

TEST(Bucketing, EveryIndexExactlyOnce) {
  std::vector<BucketEntry> entries;
  for (int i = 0; i < 37; ++i) entries.push_back({(i * 37) % 101 + 1, i % 3});
  auto buckets = compute_bucket_assignment_by_size(entries, {50, 200});
  std::vector<int> seen(entries.size(), 0);
  for (const auto& b : buckets) {
    ASSERT_FALSE(b.empty());
    for (auto i : b) {
      ++seen[i];
      EXPECT_EQ(entries[i].key, entries[b[0]].key);
    }
  }
  for (auto s : seen) EXPECT_EQ(s, 1);
}

TEST(Bucketing, RejectsBadLimits) {
  EXPECT_THROW(compute_bucket_assignment_by_size(std::vector<BucketEntry>{}, {}),
               tdist::InvalidArgument);
  EXPECT_THROW(compute_bucket_assignment_by_size(std::vector<BucketEntry>{}, {0}),
               tdist::InvalidArgument);
}

TEST(ZeroPartition, GreedyLargestFirst) {
  // Sizes 10, 1, 7, 3, 5 over 2 ranks, largest first: 10->r0, 7->r1, 5->r1 (7 < 10),
  // 3->r0 (10 < 12), 1->r1 (12 < 13).
  auto parts = tdist::ddp::detail::partition_parameters({10, 1, 7, 3, 5}, 2);
  EXPECT_EQ(parts, (Buckets{{0, 3}, {1, 2, 4}}));
}

TEST(ZeroPartition, BalancedAndComplete) {
  std::vector<int64_t> sizes;
  for (int i = 0; i < 50; ++i) sizes.push_back((i * 7919) % 1000 + 1);
  for (int world : {1, 2, 3, 4, 7}) {
    auto parts = tdist::ddp::detail::partition_parameters(sizes, world);
    ASSERT_EQ(static_cast<int>(parts.size()), world);
    std::vector<int> seen(sizes.size(), 0);
    int64_t lo = INT64_MAX, hi = 0, biggest = 0;
    for (const auto& p : parts) {
      int64_t load = 0;
      for (auto i : p) {
        ++seen[i];
        load += sizes[i];
      }
      lo = std::min(lo, load);
      hi = std::max(hi, load);
    }
    for (auto s : sizes) biggest = std::max(biggest, s);
    for (auto s : seen) EXPECT_EQ(s, 1);
    EXPECT_LE(hi - lo, biggest) << "world " << world;  // greedy bound
  }
}

TEST(ZeroPartition, MoreRanksThanParams) {
  auto parts = tdist::ddp::detail::partition_parameters({5, 5}, 4);
  EXPECT_EQ(parts, (Buckets{{0}, {1}, {}, {}}));
}

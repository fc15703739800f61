// broadcast_coalesced: the bucket plan (pure), and the broadcast at world sizes 1-4 from a
// non-zero root, with mixed dtypes, buckets smaller than some tensors, non-contiguous
// tensors and views, on the world and on a subgroup.
#include <torch/torch.h>

#include "comm/comm_test_util.h"
#include "tdist/comm/broadcast_coalesced.h"
#include "tdist/error.h"

namespace tdist {
namespace {

using namespace tdist::testing;
using Plan = std::vector<std::vector<size_t>>;

TEST(BroadcastCoalescedPlan, FillsBucketsPerKindUpToTheLimitInOrder) {
  const std::vector<at::Tensor> tensors = {
      torch::zeros({4}, torch::kFloat32),  // 16 bytes
      torch::zeros({2}, torch::kInt64),    // 16
      torch::zeros({4}, torch::kFloat32),  // 16: fills the first float bucket (32)
      torch::zeros({1}, torch::kFloat32),  // 4: opens a second one
      torch::zeros({3}, torch::kInt64),    // 24: 40 > 32, the int bucket closes first
  };
  EXPECT_EQ(plan_broadcast_buckets(tensors, 32), (Plan{{0, 2}, {1}, {3}, {4}}));
  // One bucket per kind when everything fits.
  EXPECT_EQ(plan_broadcast_buckets(tensors, 1 << 20), (Plan{{0, 2, 3}, {1, 4}}));
}

TEST(BroadcastCoalescedPlan, ATensorLargerThanABucketTravelsAlone) {
  const std::vector<at::Tensor> tensors = {torch::zeros({1}), torch::zeros({100}),
                                           torch::zeros({1}), torch::zeros({0})};
  EXPECT_EQ(plan_broadcast_buckets(tensors, 8), (Plan{{0}, {1}, {2, 3}}));
  EXPECT_TRUE(plan_broadcast_buckets({}, 8).empty());
}

TEST(BroadcastCoalescedPlan, RefusesANonPositiveBucketAndUndefinedTensors) {
  EXPECT_THROW(plan_broadcast_buckets({torch::zeros({1})}, 0), InvalidArgument);
  EXPECT_THROW(plan_broadcast_buckets({torch::zeros({1}), at::Tensor()}, 8), InvalidArgument);
}

/// Rank-dependent values of every kind the test sends; `base` holds the non-contiguous one.
std::vector<at::Tensor> state_of(int rank, at::Tensor& base) {
  const double r = rank + 1;
  base = torch::arange(24, torch::kFloat64).reshape({4, 6}) * r;
  return {torch::full({3, 5}, r, torch::kFloat32),
          torch::arange(7, torch::kInt64) * rank,
          torch::full({40}, -r, torch::kFloat32),  // larger than the bucket
          base.t(),                                // non-contiguous
          base.narrow(0, 1, 2),                    // a contiguous view into base
          torch::full({2}, rank % 2 == 1, torch::kBool),
          torch::zeros({0}, torch::kFloat32)};
}

/// Broadcasts from the group's last rank.
void check_broadcast_coalesced(const ProcessGroupPtr& group) {
  const int rank = get_rank(group);
  const int root_group_rank = get_world_size(group) - 1;
  const int src = get_global_rank(group ? group : group_world(), root_group_rank);
  at::Tensor base, expected_base;
  std::vector<at::Tensor> mine = state_of(rank, base);
  const std::vector<at::Tensor> expected = state_of(root_group_rank, expected_base);
  broadcast_coalesced(mine, src, group, /*bucket_bytes=*/64);
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_TRUE(torch::equal(mine[i], expected[i])) << "tensor " << i << " on rank " << rank;
  }
  // The writes went through to the storage the views share.
  EXPECT_TRUE(torch::equal(base, expected_base)) << "rank " << rank;
}

TDIST_SCENARIO(comm_broadcast_coalesced) {
  init_process_group(test_init_options());
  check_on_world_and_a_subgroup(check_broadcast_coalesced);
  destroy_process_group();
}

TEST(BroadcastCoalesced, WorldSizes1To4FromTheLastRank) {
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("world size " + std::to_string(n));
    expect_all_ok(run_ranks_as_processes("comm_broadcast_coalesced", n, short_run()));
  }
}

}  // namespace
}  // namespace tdist

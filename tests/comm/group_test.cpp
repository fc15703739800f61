// new_group: membership, rank queries, global -> group rank translation, and disjoint and
// overlapping groups used at the same time from different threads.
#include <thread>

#include <torch/torch.h>

#include "comm/comm_test_util.h"

namespace tdist {
namespace {

using namespace tdist::testing;

TDIST_SCENARIO(comm_groups) {
  init_process_group(test_init_options());
  const int rank = get_rank(), n = get_world_size();
  std::vector<int> evens, odds, tail;
  for (int r = 0; r < n; ++r) (r % 2 ? odds : evens).push_back(r);
  for (int r = n - 1; r >= 1; --r) tail.push_back(r);  // unsorted on purpose
  auto g_even = new_group(evens);
  auto g_odd = odds.empty() ? nullptr : new_group(odds);
  auto g_tail = tail.empty() ? nullptr : new_group(tail);
  auto g_all = new_group();

  auto& mine = rank % 2 ? g_odd : g_even;
  const auto& mine_ranks = rank % 2 ? odds : evens;
  EXPECT_TRUE(mine->is_member());
  EXPECT_EQ(get_world_size(mine), static_cast<int>(mine_ranks.size()));
  EXPECT_EQ(get_rank(mine), rank / 2);
  EXPECT_EQ(get_group_rank(mine, rank), rank / 2);
  EXPECT_EQ(get_global_rank(mine, 0), rank % 2);
  EXPECT_EQ(get_backend(mine), test_backend());
  auto& other = rank % 2 ? g_even : g_odd;
  if (other) {
    EXPECT_FALSE(other->is_member());
    EXPECT_EQ(get_rank(other), -1);
    EXPECT_EQ(get_world_size(other), -1);
    // A non-member's collective is a no-op, as in torch.distributed.
    at::Tensor untouched = torch::ones({1});
    all_reduce(untouched, ReduceOp::SUM, other);
    EXPECT_EQ(untouched.item<float>(), 1.0f);
  }
  if (g_tail) {
    EXPECT_EQ(g_tail->global_ranks().front(), 1);  // sorted
    EXPECT_EQ(g_tail->is_member(), rank >= 1);
    if (rank >= 1) {
      // Global src n-1 is group rank n-2.
      at::Tensor b = torch::full({1}, static_cast<float>(rank));
      broadcast(b, n - 1, g_tail);
      EXPECT_EQ(b.item<float>(), n - 1);
      EXPECT_THROW(broadcast(b, 0, g_tail), InvalidArgument);  // rank 0 is not a member
    }
  }
  EXPECT_EQ(get_world_size(g_all), n);

  // Disjoint groups on one thread, the overlapping tail group and the all-ranks group on two
  // others, all at once: results must stay exact.
  const int rounds = 20;
  auto run = [&](const ProcessGroupPtr& g, const std::vector<int>& members, float scale) {
    if (!g || !g->is_member()) return;
    float expected = 0;
    for (int m : members) expected += (m + 1) * scale;
    for (int i = 0; i < rounds; ++i) {
      at::Tensor t = torch::full({5}, (rank + 1) * scale);
      all_reduce(t, ReduceOp::SUM, g);
      EXPECT_TRUE(t.eq(expected).all().item<bool>()) << "group " << g->name() << " round " << i;
    }
  };
  std::vector<int> all_ranks;
  for (int r = 0; r < n; ++r) all_ranks.push_back(r);
  std::thread a([&] { run(mine, mine_ranks, 1.0f); });
  std::thread b([&] { run(g_tail, tail, 10.0f); });
  std::thread c([&] { run(g_all, all_ranks, 100.0f); });
  a.join();
  b.join();
  c.join();

  destroy_process_group(g_all);
  EXPECT_THROW(all_reduce(torch::ones({1}), ReduceOp::SUM, g_all), InvalidArgument);
  destroy_process_group();
}

TEST(Groups, DisjointAndOverlappingGroupsConcurrently) {
  for (int n = 2; n <= 4; ++n) {
    SCOPED_TRACE("world size " + std::to_string(n));
    expect_all_ok(run_ranks_as_processes("comm_groups", n, short_run()));
  }
}

TDIST_SCENARIO(comm_group_bad_ranks) {
  init_process_group(test_init_options());
  EXPECT_THROW(new_group({0, 0}), InvalidArgument);
  EXPECT_THROW(new_group({0, get_world_size()}), InvalidArgument);
  EXPECT_THROW(new_group({-1}), InvalidArgument);
  EXPECT_THROW(get_group_rank(group_world(), 99), InvalidArgument);
  EXPECT_THROW(get_global_rank(group_world(), -1), InvalidArgument);
  // Failed calls must not desynchronise group numbering: a valid group still works.
  auto g = new_group();
  at::Tensor t = torch::ones({1});
  all_reduce(t, ReduceOp::SUM, g);
  EXPECT_EQ(t.item<float>(), get_world_size());
  destroy_process_group();
}

TEST(Groups, InvalidRanksAreRejected) {
  expect_all_ok(run_ranks_as_processes("comm_group_bad_ranks", 2, short_run()));
}

}  // namespace
}  // namespace tdist

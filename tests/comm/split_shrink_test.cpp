// split_group and shrink_group (torch.distributed's) at world sizes 1-4: which group each rank
// lands in, collectives on it, splits of a subgroup (parent ranks are not global ranks),
// shrinking a subgroup while the excluded rank carries on in the world, shrinking the world
// itself (ranks renumbered, other groups destroyed), and every bad argument refused on every
// rank before anything is created.
#include <torch/torch.h>

#include <numeric>

#include "comm/comm_test_util.h"
#include "support/expect.h"
#include "tdist/comm/split_group.h"

namespace tdist::split_shrink_test {
namespace {

using namespace tdist::testing;

/// The sum of the global ranks of `g`, computed by `g`.
int64_t sum_of_global_ranks(const ProcessGroupPtr& g) {
  at::Tensor t = torch::full({1}, group_world()->rank(), torch::kLong);
  all_reduce(t, ReduceOp::SUM, g);
  return t.item<int64_t>();
}

int64_t sum(const std::vector<int>& ranks) {
  return std::accumulate(ranks.begin(), ranks.end(), int64_t{0});
}

/// Splits `parent` into `lists` (ranks of the parent) and checks this rank's group.
void check_split(const ProcessGroupPtr& parent, const std::vector<std::vector<int>>& lists) {
  const int me = get_rank(parent);
  const ProcessGroupPtr g = split_group(parent, lists);
  const std::vector<int>* mine = nullptr;
  for (const auto& list : lists) {
    if (std::find(list.begin(), list.end(), me) != list.end()) mine = &list;
  }
  if (mine == nullptr) {
    EXPECT_EQ(g, nullptr) << "a rank in no list got a group";
    return;
  }
  ASSERT_NE(g, nullptr);
  std::vector<int> parent_ranks = *mine;
  std::sort(parent_ranks.begin(), parent_ranks.end());
  std::vector<int> globals;
  for (int r : parent_ranks) globals.push_back(get_global_rank(parent, r));
  EXPECT_EQ(get_process_group_ranks(g), globals);
  EXPECT_EQ(get_rank(g),
            std::find(parent_ranks.begin(), parent_ranks.end(), me) - parent_ranks.begin());
  EXPECT_EQ(get_backend(g), get_backend(parent));
  EXPECT_NE(g->group_desc().find(parent->group_desc() + ":split:"), std::string::npos)
      << g->group_desc();
  EXPECT_EQ(sum_of_global_ranks(g), sum(globals));
  // Rooted collectives see the group's ranks.
  at::Tensor t = torch::full({2}, static_cast<float>(group_world()->rank()));
  broadcast(t, std::nullopt, g, false, get_world_size(g) - 1);
  EXPECT_EQ(t[0].item<float>(), static_cast<float>(globals.back()));
}

void check_split_refused(const ProcessGroupPtr& parent) {
  const int size = get_world_size(parent);
  expect_invalid_argument([&] { split_group(parent, {}); }, "split_ranks is empty");
  expect_invalid_argument([&] { split_group(parent, {{0}, {}}); }, "split_ranks[1] is empty");
  expect_invalid_argument(
      [&] {
        split_group(parent, {{0, size}});
      },
      "rank " + std::to_string(size) + " of split_ranks[0] is outside the parent group [0, " +
          std::to_string(size) + ")");
  expect_invalid_argument(
      [&] {
        split_group(parent, {{0, 0}});
      },
      "rank 0 is listed twice in split_ranks[0] [0, 0]");
  expect_invalid_argument(
      [&] {
        split_group(parent, {{0}, {0}});
      },
      "rank 0 is in split_ranks[0] [0] and in split_ranks[1] [0]; each rank "
      "belongs to at most one new group");
  expect_invalid_argument(
      [&] { split_group(parent, {{0}}, SplitGroupOptions().pg_options(std::string("x"))); },
      "pg_options were given, but the group's cpu backend");
}

TDIST_SCENARIO(comm_split_group) {
  init_process_group(test_init_options());
  const int n = get_world_size(), rank = get_rank();
  std::vector<int> evens, odds, all;
  for (int r = 0; r < n; ++r) (r % 2 ? odds : evens).push_back(r);
  for (int r = n - 1; r >= 0; --r) all.push_back(r);  // unsorted: group ranks sort them
  check_split_refused(group_world());
  check_split(group_world(), odds.empty() ? std::vector<std::vector<int>>{evens}
                                          : std::vector<std::vector<int>>{odds, evens});
  check_split(group_world(), {all});
  check_split(group_world(), {{n - 1}});  // every other rank gets null
  // A split of a subgroup: parent ranks, not global ranks. The subgroup {1, ..., n-1}
  // splits into its first rank alone and the rest; global rank 0 is not in the parent.
  if (n > 1) {
    std::vector<int> tail(all.rbegin() + 1, all.rend());
    const ProcessGroupPtr parent = new_group(tail);
    if (parent->is_member()) {
      std::vector<int> rest;
      for (int r = 1; r < get_world_size(parent); ++r) rest.push_back(r);
      check_split(parent, rest.empty() ? std::vector<std::vector<int>>{{0}}
                                       : std::vector<std::vector<int>>{{0}, rest});
      check_split_refused(parent);
    } else {
      expect_invalid_argument([&] { split_group(parent, {{0}}); },
                              "global rank 0 is not a member of the parent group");
    }
  }
  // Given options; the group can be destroyed like any other.
  const ProcessGroupPtr mine = split_group(
      nullptr, {evens}, SplitGroupOptions().group_desc("evens").timeout(std::chrono::seconds(20)));
  if (rank % 2 == 0) {
    ASSERT_NE(mine, nullptr);
    EXPECT_EQ(mine->group_desc(), "evens");
    EXPECT_EQ(mine->timeout(), std::chrono::seconds(20));
    destroy_process_group(mine);
    at::Tensor t = torch::zeros({1});
    expect_invalid_argument([&] { all_reduce(t, ReduceOp::SUM, mine); }, "was destroyed");
  }
  barrier();
  destroy_process_group();
}

TEST(SplitGroup, SplitsOfTheWorldAndOfASubgroupAtWorlds1To4) {
  expect_all_ok_at_worlds("comm_split_group", {1, 2, 3, 4}, short_run());
}

void check_shrink_refused(const ProcessGroupPtr& g) {
  const int size = get_world_size(g), me = get_rank(g);
  expect_invalid_argument([&] { shrink_group({}, g); }, "ranks_to_exclude is empty");
  expect_invalid_argument([&] { shrink_group({0}, g, ShrinkGroupOptions().shrink_flags(2)); },
                          "shrink_flags 2 is neither kShrinkDefault (0) nor kShrinkAbort (1)");
  if (size < 2) {
    expect_invalid_argument([&] { shrink_group({0}, g); },
                            "a group must have at least 2 ranks to shrink");
    return;
  }
  expect_invalid_argument([&] { shrink_group({size}, g); },
                          "rank " + std::to_string(size) + " at index 0 is outside group");
  expect_invalid_argument([&] { shrink_group({-1}, g); }, "rank -1 at index 0 is outside group");
  const int other = (me + 1) % size;
  expect_invalid_argument(
      [&] {
        shrink_group({other, other}, g);
      },
      "rank " + std::to_string(other) + " is listed twice");
  std::vector<int> everyone(size);
  std::iota(everyone.begin(), everyone.end(), 0);
  expect_invalid_argument([&] { shrink_group(everyone, g); }, "at least one must remain");
  expect_invalid_argument([&] { shrink_group({me}, g); },
                          "is in ranks_to_exclude; only the remaining ranks call shrink_group");
  expect_invalid_argument([&] { shrink_group({other}, g, ShrinkGroupOptions().pg_options(1)); },
                          "pg_options were given");
}

TDIST_SCENARIO(comm_shrink_group) {
  init_process_group(test_init_options());
  const int n = get_world_size(), rank = get_rank();
  check_shrink_refused(group_world());
  if (n == 1) {
    destroy_process_group();
    return;
  }
  // A subgroup of everyone loses group rank 0 (global rank 0); the rest carry on in a new
  // group, rank 0 in the world only.
  std::vector<int> everyone(n);
  std::iota(everyone.begin(), everyone.end(), 0);
  const ProcessGroupPtr g = new_group(everyone);
  check_shrink_refused(g);
  if (rank != 0) {
    const ProcessGroupPtr shrunk = shrink_group({0}, g);
    std::vector<int> rest(everyone.begin() + 1, everyone.end());
    EXPECT_EQ(get_process_group_ranks(shrunk), rest);
    EXPECT_EQ(get_rank(shrunk), rank - 1);
    EXPECT_EQ(sum_of_global_ranks(shrunk), sum(rest));
    at::Tensor t = torch::zeros({1});
    expect_invalid_argument([&] { all_reduce(t, ReduceOp::SUM, g); }, "was destroyed");
  }
  EXPECT_EQ(sum_of_global_ranks(nullptr), sum(everyone));

  // The world loses rank 1 (not rank 0, whose process hosts the store): the ranks above it
  // renumber down by one, and every other group goes.
  const ProcessGroupPtr pair = new_group({0, n - 1});
  if (rank == 1) {
    // Excluded: leaves without a collective (its exit counts for the old world).
    destroy_process_group();
    return;
  }
  const ProcessGroupPtr world = shrink_group({1});
  const int renumbered = rank == 0 ? 0 : rank - 1;
  EXPECT_EQ(world, group_world());
  EXPECT_EQ(world->group_desc(), "default:shrunken");
  EXPECT_EQ(get_world_size(), n - 1);
  EXPECT_EQ(get_rank(), renumbered);
  std::vector<int> renumbered_world(n - 1);
  std::iota(renumbered_world.begin(), renumbered_world.end(), 0);
  EXPECT_EQ(get_process_group_ranks(), renumbered_world);
  EXPECT_TRUE(pair->is_destroyed());
  EXPECT_EQ(sum_of_global_ranks(nullptr), sum(renumbered_world));
  // New groups name the new world's ranks.
  const ProcessGroupPtr last = new_group({n - 2});
  EXPECT_EQ(last->is_member(), renumbered == n - 2);
  if (last->is_member()) {
    EXPECT_EQ(sum_of_global_ranks(last), n - 2);
  }
  barrier();
  destroy_process_group();
}

TEST(ShrinkGroup, ASubgroupAndTheWorldAtWorlds1To4) {
  expect_all_ok_at_worlds("comm_shrink_group", {1, 2, 3, 4}, short_run());
}

}  // namespace
}  // namespace tdist::split_shrink_test

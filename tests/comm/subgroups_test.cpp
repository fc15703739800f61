// get_process_group_ranks, new_subgroups and new_subgroups_by_enumeration at world sizes 1-4
// and 6: which subgroup each rank lands in, collectives on it, subgroups of a subgroup, and
// every bad argument refused on every rank without leaving groups behind.
#include <ATen/Context.h>
#include <torch/torch.h>

#include <numeric>

#include "comm/comm_test_util.h"

namespace tdist {
namespace {

using namespace tdist::testing;

std::vector<int> iota_ranks(int first, int count, int step = 1) {
  std::vector<int> ranks;
  for (int i = 0; i < count; ++i) ranks.push_back(first + i * step);
  return ranks;
}

/// The sum of the global ranks of this rank's subgroup, computed by the subgroup.
int sum_of_ranks_in(const ProcessGroupPtr& subgroup) {
  at::Tensor t = torch::full({1}, get_rank(), torch::kLong);
  all_reduce(t, ReduceOp::SUM, subgroup);
  return static_cast<int>(t.item<int64_t>());
}

int sum(const std::vector<int>& ranks) {
  return std::accumulate(ranks.begin(), ranks.end(), 0);
}

void expect_consecutive_subgroups(const Subgroups& s, int group_size, int n) {
  const int rank = get_rank();
  ASSERT_EQ(static_cast<int>(s.all.size()), n / group_size);
  ASSERT_TRUE(s.current);
  const std::vector<int> mine = iota_ranks(rank - rank % group_size, group_size);
  EXPECT_EQ(get_process_group_ranks(s.current), mine);
  EXPECT_EQ(s.current, s.all[rank / group_size]);
  EXPECT_EQ(sum_of_ranks_in(s.current), sum(mine)) << "group_size " << group_size;
  for (int i = 0; i < static_cast<int>(s.all.size()); ++i) {
    EXPECT_EQ(s.all[i]->is_member(), i == rank / group_size);
    EXPECT_EQ(get_process_group_ranks(s.all[i]), iota_ranks(i * group_size, group_size));
  }
}

void check_refused(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected an error containing '" << fragment << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TDIST_SCENARIO(comm_subgroups) {
  init_process_group(test_init_options());
  const int rank = get_rank(), n = get_world_size();

  EXPECT_EQ(get_process_group_ranks(), iota_ranks(0, n));
  // Group-rank order is sorted global ranks, on members and non-members alike.
  const std::vector<int> ends_ranks = n > 1 ? std::vector<int>{0, n - 1} : std::vector<int>{0};
  auto ends = new_group({ends_ranks.rbegin(), ends_ranks.rend()});
  EXPECT_EQ(get_process_group_ranks(ends), ends_ranks);

  for (int group_size = 1; group_size <= n; ++group_size) {
    if (n % group_size == 0) expect_consecutive_subgroups(new_subgroups(group_size), group_size, n);
  }

  // Subgroups of a subgroup: the world's even ranks, in pairs of their group ranks; odd ranks
  // belong to none, and their `current` is null.
  const std::vector<int> evens = iota_ranks(0, (n + 1) / 2, 2);
  auto even_group = new_group(evens);
  if (evens.size() % 2 == 0) {
    Subgroups pairs = new_subgroups(2, even_group);
    ASSERT_EQ(pairs.all.size(), evens.size() / 2);
    if (rank % 2 == 1) {
      EXPECT_FALSE(pairs.current);
    } else {
      const int first = rank - rank % 4;
      EXPECT_EQ(get_process_group_ranks(pairs.current), (std::vector<int>{first, first + 2}));
      EXPECT_EQ(sum_of_ranks_in(pairs.current), 2 * first + 2);
    }
  }

  // Interleaved and partial enumerations; unsorted lists are sorted as new_group sorts them.
  const std::vector<int> odds = iota_ranks(1, n / 2, 2);
  std::vector<std::vector<int>> interleaved{{evens.rbegin(), evens.rend()}};
  if (!odds.empty()) interleaved.push_back(odds);
  Subgroups by_parity = new_subgroups_by_enumeration(interleaved);
  ASSERT_EQ(by_parity.all.size(), interleaved.size());
  ASSERT_TRUE(by_parity.current);
  EXPECT_EQ(get_process_group_ranks(by_parity.current), rank % 2 ? odds : evens);
  EXPECT_EQ(sum_of_ranks_in(by_parity.current), sum(rank % 2 ? odds : evens));
  Subgroups last_only = new_subgroups_by_enumeration({{n - 1}});
  EXPECT_EQ(static_cast<bool>(last_only.current), rank == n - 1);

  check_refused([] { new_subgroups(-1); }, "group_size -1 must be positive");
  check_refused([&] { new_subgroups(n + 1); },
                "group_size " + std::to_string(n + 1) + " exceeds the group's size");
  if (n > 2) {
    check_refused([&] { new_subgroups(n - 1); }, "is not divisible by group_size");
  }
  if (at::getNumGPUs() == 0) check_refused([] { new_subgroups(); }, "pass group_size");
  check_refused([] { new_subgroups_by_enumeration({}); }, "the list of subgroups is empty");
  check_refused([] { new_subgroups_by_enumeration({{0}, {}}); }, "subgroup #1 is empty");
  check_refused(
      [&] {
        new_subgroups_by_enumeration({{0}, {n}});
      },
      "rank " + std::to_string(n) + " of subgroup #1 is outside the world");
  check_refused(
      [] {
        new_subgroups_by_enumeration({{0}, {0}});
      },
      "rank 0 is in subgroup #0 [0] and in #1 [0]; subgroups must not overlap");
  // Refused calls made no groups: one made now is numbered alike on every rank and works.
  EXPECT_EQ(sum_of_ranks_in(new_group()), n * (n - 1) / 2);
  destroy_process_group();
}

TEST(Subgroups, NewSubgroupsAndEnumerationAtWorldSizes1To4And6) {
  for (int n : {1, 2, 3, 4, 6}) {
    SCOPED_TRACE("world size " + std::to_string(n));
    expect_all_ok(run_ranks_as_processes("comm_subgroups", n, short_run()));
  }
}

}  // namespace
}  // namespace tdist

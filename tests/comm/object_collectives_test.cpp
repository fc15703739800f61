// broadcast_object_list, all_gather_object, gather_object, scatter_object_list and
// send_object_list / recv_object_list with rank-dependent (uneven) payloads, and find_disagreement,
// at world sizes 1-4, on the world and on a subgroup.
#include <torch/torch.h>

#include "comm/comm_test_util.h"
#include "tdist/comm/object_collectives.h"
#include "tdist/comm/rank_agreement.h"

namespace tdist {
namespace {

using namespace tdist::testing;

Object payload(int rank) {
  return Object(Object::Dict{{"rank", Object(rank)},
                             {"name", Object(std::string(rank * 7, 'a' + rank))},
                             {"t", Object(torch::arange(rank + 1, torch::kFloat64))},
                             {"nested", Object(Object::List{Object(rank % 2 == 0), Object()})}});
}

void check_object_collectives(const ProcessGroupPtr& group) {
  const int rank = get_rank(group), n = get_world_size(group);
  auto global = [&](int r) { return get_global_rank(group ? group : group_world(), r); };

  std::vector<Object> list;
  if (rank == n - 1) list = {Object("from last"), Object(3.5), payload(rank)};
  broadcast_object_list(list, global(n - 1), group);
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].as_string(), "from last");
  EXPECT_TRUE(list[2] == payload(n - 1));

  std::vector<Object> all;
  all_gather_object(all, payload(rank), group);
  ASSERT_EQ(static_cast<int>(all.size()), n);
  for (int r = 0; r < n; ++r) EXPECT_TRUE(all[r] == payload(r)) << "from " << r;

  const int dst = n > 1 ? 1 : 0;
  std::vector<Object> gathered;
  gather_object(payload(rank), rank == dst ? &gathered : nullptr, global(dst), group);
  if (rank == dst) {
    ASSERT_EQ(static_cast<int>(gathered.size()), n);
    for (int r = 0; r < n; ++r) EXPECT_TRUE(gathered[r] == payload(r));
  } else {
    EXPECT_TRUE(gathered.empty());
  }

  std::vector<Object> inputs;
  if (rank == 0) {
    for (int r = 0; r < n; ++r) inputs.push_back(payload(r));
  }
  std::vector<Object> out;
  scatter_object_list(out, inputs, global(0), group);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0] == payload(rank));
}

// The first group rank sends each other rank its own list (as long as the rank's group rank
// plus one; the receiver's list starts longer), and each sends one back.
void check_send_recv_object_list(const ProcessGroupPtr& group) {
  const int rank = get_rank(group), n = get_world_size(group);
  auto global = [&](int r) { return get_global_rank(group ? group : group_world(), r); };
  auto list_for = [](int r) { return std::vector<Object>(r + 1, payload(r)); };
  if (rank == 0) {
    for (int r = 1; r < n; ++r) send_object_list(list_for(r), global(r), group);
    for (int r = 1; r < n; ++r) {
      std::vector<Object> back;
      EXPECT_EQ(recv_object_list(back, global(r), group), global(r));
      EXPECT_EQ(back, std::vector<Object>{payload(n + r)}) << "from " << r;
    }
    return;
  }
  std::vector<Object> got(n + 3, Object("stale"));
  EXPECT_EQ(recv_object_list(got, global(0), group), global(0));
  EXPECT_EQ(got, list_for(rank));
  send_object_list({payload(n + rank)}, global(0), group);
}

// Every rank gets the same answer: the lowest differing rank, its first differing line.
void check_find_disagreement(const ProcessGroupPtr& group) {
  const int rank = get_rank(group), n = get_world_size(group);
  auto global = [&](int r) { return get_global_rank(group ? group : group_world(), r); };
  const std::vector<std::string> same{"a", "b"};
  EXPECT_FALSE(find_disagreement(same, group).has_value());

  std::vector<std::string> longer = same;
  if (rank == n - 1) longer.push_back("extra");
  auto d = find_disagreement(longer, group);
  ASSERT_EQ(d.has_value(), n > 1);
  if (d) {
    EXPECT_EQ(d->rank, global(n - 1));
    EXPECT_EQ(d->reference_rank, global(0));
    EXPECT_EQ(d->line, 2u);
    EXPECT_EQ(d->value, "extra");
    EXPECT_FALSE(d->reference_value.has_value()) << *d->reference_value;
  }

  std::vector<std::string> changed = same;
  if (rank > 0) changed[1] = "b" + std::to_string(rank);
  d = find_disagreement(changed, group);
  ASSERT_EQ(d.has_value(), n > 1);
  if (d) {
    EXPECT_EQ(d->rank, global(1));
    EXPECT_EQ(d->line, 1u);
    EXPECT_EQ(d->value, "b1");
    EXPECT_EQ(d->reference_value, "b");
  }
}

TDIST_SCENARIO(comm_object_collectives) {
  init_process_group(test_init_options());
  check_on_world_and_a_subgroup(check_object_collectives);
  check_on_world_and_a_subgroup(check_find_disagreement);
  check_on_world_and_a_subgroup(check_send_recv_object_list);
  // A rank outside the group receives nothing and says so with -1, as torch.distributed.
  if (get_world_size() > 1) {
    auto only_first = new_group({0});
    std::vector<Object> untouched{Object(7)};
    if (get_rank() != 0) {
      EXPECT_EQ(recv_object_list(untouched, 0, only_first), -1);
    }
    EXPECT_EQ(untouched, std::vector<Object>{Object(7)});
  }
  destroy_process_group();
}

TEST(ObjectCollectives, WorldSizes1To4) {
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("world size " + std::to_string(n));
    expect_all_ok(run_ranks_as_processes("comm_object_collectives", n, short_run()));
  }
}

}  // namespace
}  // namespace tdist

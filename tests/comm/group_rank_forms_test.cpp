// The group_src/group_dst forms of the rooted collectives, the object collectives and
// point-to-point (torch.distributed's), at world sizes 1-4: every root of the world and of a
// subgroup whose group ranks are not its global ranks, each form giving what the global-rank
// form gives; and the one-of rule (both, or neither where there is no default) refused on
// every rank, members or not, naming both arguments.
#include <torch/torch.h>

#include "comm/comm_test_util.h"
#include "support/expect.h"
#include "tdist/comm/object_collectives.h"

namespace tdist::group_rank_forms_test {
namespace {

using namespace tdist::testing;

/// What group rank `r` of `g` contributes: derived from its global rank, so a root confused
/// with a global rank shows.
float value_of(const ProcessGroupPtr& g, int r) {
  return 10.0f * static_cast<float>(get_global_rank(g, r)) + 1.0f;
}

void check_rooted_collectives(const ProcessGroupPtr& g, int root) {
  const int size = get_world_size(g), me = get_rank(g);
  const float mine = value_of(g, me), roots = value_of(g, root);
  SCOPED_TRACE("group rank root " + std::to_string(root) + " of " + std::to_string(size));

  at::Tensor t = torch::full({3}, mine);
  broadcast(t, std::nullopt, g, false, /*group_src=*/root);
  EXPECT_TRUE(t.equal(torch::full({3}, roots))) << t;
  t.fill_(mine);
  broadcast(t, get_global_rank(g, root), g);
  EXPECT_TRUE(t.equal(torch::full({3}, roots))) << t;

  float total = 0;
  for (int r = 0; r < size; ++r) total += value_of(g, r);
  t = torch::full({2}, mine);
  reduce(t, std::nullopt, ReduceOp::SUM, g, false, /*group_dst=*/root);
  EXPECT_TRUE(t.equal(torch::full({2}, me == root ? total : mine))) << t;

  std::vector<at::Tensor> gathered;
  if (me == root) {
    for (int r = 0; r < size; ++r) gathered.push_back(torch::zeros({2}));
  }
  gather(torch::full({2}, mine), gathered, std::nullopt, g, false, /*group_dst=*/root);
  for (int r = 0; r < static_cast<int>(gathered.size()); ++r) {
    EXPECT_TRUE(gathered[r].equal(torch::full({2}, value_of(g, r)))) << gathered[r];
  }

  std::vector<at::Tensor> parts;
  if (me == root) {
    for (int r = 0; r < size; ++r) parts.push_back(torch::full({2}, value_of(g, r) + 0.5f));
  }
  t = torch::zeros({2});
  scatter(t, parts, std::nullopt, g, false, /*group_src=*/root);
  EXPECT_TRUE(t.equal(torch::full({2}, mine + 0.5f))) << t;

  std::vector<Object> list{Object(static_cast<int64_t>(mine))};
  broadcast_object_list(list, std::nullopt, g, /*group_src=*/root);
  EXPECT_EQ(list, std::vector<Object>{Object(static_cast<int64_t>(roots))});
  std::vector<Object> objects;
  gather_object(Object(static_cast<int64_t>(mine)), me == root ? &objects : nullptr, std::nullopt,
                g, /*group_dst=*/root);
  if (me == root) {
    ASSERT_EQ(static_cast<int>(objects.size()), size);
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(objects[r].as_int(), static_cast<int64_t>(value_of(g, r)));
    }
  }
  std::vector<Object> in, out;
  if (me == root) {
    for (int r = 0; r < size; ++r) in.emplace_back("for " + std::to_string(r));
  }
  scatter_object_list(out, in, std::nullopt, g, /*group_src=*/root);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].as_string(), "for " + std::to_string(me));
}

/// A ring over the group in every point-to-point form: each returns the sender's global rank.
void check_point_to_point(const ProcessGroupPtr& g) {
  const int size = get_world_size(g), me = get_rank(g);
  if (size == 1) return;
  const int right = (me + 1) % size, left = (me - 1 + size) % size;
  at::Tensor got = torch::zeros({4});
  WorkPtr sent = isend(torch::full({4}, value_of(g, me)), std::nullopt, g, 5, /*group_dst=*/right);
  EXPECT_EQ(recv(got, std::nullopt, g, 5, /*group_src=*/left), get_global_rank(g, left));
  sent->wait();
  EXPECT_TRUE(got.equal(torch::full({4}, value_of(g, left)))) << got;

  got.zero_();
  sent = isend(torch::full({4}, value_of(g, me) + 1), get_global_rank(g, right), g, 6);
  WorkPtr received = irecv(got, std::nullopt, g, 6, /*group_src=*/left);
  received->wait();
  sent->wait();
  EXPECT_EQ(received->source_rank(), left);
  EXPECT_TRUE(got.equal(torch::full({4}, value_of(g, left) + 1))) << got;

  // P2POp keeps both forms, from either one.
  const P2POp to_right(isend, torch::full({2}, value_of(g, me)), std::nullopt, g, 7, right);
  EXPECT_EQ(to_right.peer, get_global_rank(g, right));
  EXPECT_EQ(to_right.group_peer, right);
  at::Tensor from_left = torch::zeros({2});
  const P2POp from(irecv, from_left, get_global_rank(g, left), g, 7);
  EXPECT_EQ(from.group_peer, left);
  for (auto& w : batch_isend_irecv({to_right, from})) w->wait();
  EXPECT_TRUE(from_left.equal(torch::full({2}, value_of(g, left)))) << from_left;

  std::vector<Object> objects{Object("from " + std::to_string(me))};
  if (me % 2 == 0 && me + 1 < size) {
    send_object_list(objects, std::nullopt, g, /*group_dst=*/me + 1);
  } else if (me % 2 == 1) {
    std::vector<Object> received_objects;
    EXPECT_EQ(recv_object_list(received_objects, std::nullopt, g, /*group_src=*/me - 1),
              get_global_rank(g, me - 1));
    EXPECT_EQ(received_objects, std::vector<Object>{Object("from " + std::to_string(me - 1))});
  }
}

/// Refused on every rank of the world, members of `g` or not, before anything is sent.
void check_one_of_rule(const ProcessGroupPtr& g) {
  at::Tensor t = torch::zeros({1});
  const int first = get_process_group_ranks(g).front();
  const std::string both_src = "both src (" + std::to_string(first) + ") and group_src (0)";
  expect_invalid_argument([&] { broadcast(t, first, g, false, 0); }, both_src);
  expect_invalid_argument([&] { broadcast(t, std::nullopt, g); }, "neither src nor group_src");
  expect_invalid_argument([&] { scatter(t, {}, first, g, false, 0); }, both_src);
  const std::string both_dst = "both dst (" + std::to_string(first) + ") and group_dst (0)";
  expect_invalid_argument([&] { reduce(t, first, ReduceOp::SUM, g, false, 0); }, both_dst);
  expect_invalid_argument([&] { reduce(t, std::nullopt, ReduceOp::SUM, g); },
                          "neither dst nor group_dst");
  expect_invalid_argument([&] { gather(t, {}, first, g, false, 0); }, both_dst);
  expect_invalid_argument([&] { send(t, first, g, 0, 0); }, both_dst);
  expect_invalid_argument([&] { isend(t, std::nullopt, g); }, "neither dst nor group_dst");
  expect_invalid_argument([&] { recv(t, first, g, 0, 0); }, both_src);
  expect_invalid_argument([&] { irecv(t, first, g, 0, 0); }, both_src);
  expect_invalid_argument([&] { (void)P2POp(isend, t, first, g, 0, 0); },
                          "both peer (" + std::to_string(first) + ") and group_peer (0)");
  expect_invalid_argument([&] { (void)P2POp(irecv, t, std::nullopt, g); },
                          "neither peer nor group_peer");
  std::vector<Object> objects;
  expect_invalid_argument([&] { broadcast_object_list(objects, first, g, 0); }, both_src);
  expect_invalid_argument([&] { gather_object(Object(1), &objects, first, g, 0); }, both_dst);
  expect_invalid_argument([&] { scatter_object_list(objects, {}, first, g, 0); }, both_src);
  expect_invalid_argument([&] { send_object_list(objects, first, g, 0); }, both_dst);
  expect_invalid_argument([&] { send_object_list(objects, std::nullopt, g); },
                          "neither dst nor group_dst");
  expect_invalid_argument([&] { recv_object_list(objects, std::nullopt, g); },
                          "neither src nor group_src");
  if (!g->is_member()) return;
  const int size = get_world_size(g);
  expect_invalid_argument([&] { broadcast(t, std::nullopt, g, false, size); },
                          "group_src " + std::to_string(size) + " is outside process group");
  expect_invalid_argument([&] { send(t, std::nullopt, g, 0, -1); },
                          "group_dst -1 is outside process group");
}

TDIST_SCENARIO(comm_group_rank_forms) {
  init_process_group(test_init_options());
  const int n = get_world_size();
  std::vector<int> all_but_first;
  for (int r = 1; r < n; ++r) all_but_first.push_back(r);
  // Group rank r is global rank r + 1; global rank 0 is in no such group.
  std::vector<ProcessGroupPtr> groups{group_world()};
  if (n > 1) groups.push_back(new_group(all_but_first));
  for (const auto& g : groups) {
    check_one_of_rule(g);
    if (!g->is_member()) continue;
    for (int root = 0; root < get_world_size(g); ++root) check_rooted_collectives(g, root);
    check_point_to_point(g);
  }
  if (n > 1) {
    const ProcessGroupPtr& g = groups.back();
    at::Tensor t = torch::zeros({1});
    // Neither dst nor group_dst: global rank 0, as torch.distributed, which this group lacks.
    if (g->is_member()) {
      expect_invalid_argument([&] { gather(t, {}, std::nullopt, g); },
                              "global rank 0 is not a member");
      expect_invalid_argument([&] { scatter(t, {}, std::nullopt, g); },
                              "global rank 0 is not a member");
    } else {
      // A non-member's collective is a no-op in either form.
      broadcast(t, std::nullopt, g, false, 0);
      reduce(t, 1, ReduceOp::SUM, g);
    }
  }
  barrier();
  destroy_process_group();
}

TEST(GroupRankForms, RootedCollectivesObjectsAndPointToPointAtWorlds1To4) {
  expect_all_ok_at_worlds("comm_group_rank_forms", {1, 2, 3, 4},
                          short_run(std::chrono::seconds(120)));
}

}  // namespace
}  // namespace tdist::group_rank_forms_test

// recv and irecv from any source (no src, no group_src) over Gloo at world sizes 1-4: one
// rank takes every other rank's message in whatever order they come, learns each sender
// (recv: its global rank; irecv: Work::source_rank(), its group rank), on the world and on a
// subgroup whose group ranks are not global ranks; tags keep their own streams; a message
// that does not fit is refused naming its sender, and the pair stays usable.

#include <set>

#include "comm_gloo/gloo_test_util.h"
#include "support/expect.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::testing {
namespace {

/// Group rank 0 of `g` receives one message from every other member, from any source.
void gather_from_any_source(const ProcessGroupPtr& g) {
  const int size = get_world_size(g), me = get_rank(g), global = get_global_rank(g, me);
  if (me != 0) {
    send(torch::full({5}, 100.0f + static_cast<float>(global)), std::nullopt, g, 3, 0);
    return;
  }
  std::set<int> senders;
  for (int k = 1; k < size; ++k) {
    at::Tensor t = torch::zeros({5});
    const int from = recv(t, std::nullopt, g, 3);
    EXPECT_TRUE(t.equal(torch::full({5}, 100.0f + static_cast<float>(from)))) << from << ": " << t;
    senders.insert(from);
  }
  std::set<int> others;
  for (int r = 1; r < size; ++r) others.insert(get_global_rank(g, r));
  EXPECT_EQ(senders, others);
}

/// irecv from any source: the Work names the sender's group rank once it has completed.
void irecv_from_any_source(const ProcessGroupPtr& g) {
  const int size = get_world_size(g), me = get_rank(g);
  if (me == size - 1) send(torch::full({2}, 7.0), std::nullopt, g, 4, 0);
  if (me != 0) return;
  at::Tensor t = torch::zeros({2});
  WorkPtr work = irecv(t, std::nullopt, g, 4);
  work->wait();
  EXPECT_EQ(work->source_rank(), size - 1);
  EXPECT_TRUE(t.equal(torch::full({2}, 7.0))) << t;
}

TDIST_SCENARIO(gloo_recv_any_source) {
  init_process_group(InitProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(30)));
  const int rank = get_rank(), n = get_world_size();
  at::Tensor t = torch::zeros({5});
  if (n == 1) {
    expect_invalid_argument([&] { recv(t); }, "a receive from any source in a group of one rank");
    destroy_process_group();
    return;
  }
  gather_from_any_source(group_world());
  irecv_from_any_source(group_world());
  barrier();
  // Tags are separate streams: the tag-10 message is taken first although sent second.
  if (rank == 1) {
    WorkPtr first = isend(torch::full({1}, 11.0), 0, nullptr, 11);
    WorkPtr second = isend(torch::full({1}, 10.0), 0, nullptr, 10);
    first->wait();
    second->wait();
  } else if (rank == 0) {
    at::Tensor one = torch::zeros({1});
    EXPECT_EQ(recv(one, std::nullopt, nullptr, 10), 1);
    EXPECT_EQ(one.item<float>(), 10.0f);
    EXPECT_EQ(recv(one, std::nullopt, nullptr, 11), 1);
    EXPECT_EQ(one.item<float>(), 11.0f);
  }
  // A message that does not fit: refused naming the sender; the pair then works on.
  if (rank == 1) {
    send(torch::full({3}, 1.0), 0, nullptr, 9);
    send(torch::full({5}, 2.0), 0, nullptr, 9);
  } else if (rank == 0) {
    expect_invalid_argument([&] { recv(t, std::nullopt, nullptr, 9); },
                            "rank 1 sent 3 elements of Float (tag 9) but this rank receives "
                            "into 5");
    EXPECT_EQ(recv(t, std::nullopt, nullptr, 9), 1);
    EXPECT_TRUE(t.equal(torch::full({5}, 2.0))) << t;
  }
  barrier();
  if (n > 2) {
    // Group rank r is global rank r + 1.
    std::vector<int> tail;
    for (int r = 1; r < n; ++r) tail.push_back(r);
    const ProcessGroupPtr g = new_group(tail);
    if (g->is_member()) {
      gather_from_any_source(g);
      irecv_from_any_source(g);
    } else {
      EXPECT_EQ(recv(t, std::nullopt, g), -1) << "a non-member receives nothing";
    }
    barrier();
  }
  destroy_process_group();
}

TEST(RecvAnySource, WorldAndSubgroupAtWorlds1To4) {
  expect_all_ok_at_worlds("gloo_recv_any_source", {1, 2, 3, 4});
}

}  // namespace
}  // namespace tdist::testing

// batch_isend_irecv (torch.distributed's P2POp batches) with real ranks over Gloo: every rank
// sends to both neighbours and receives from both in one batch, which deadlocks if a backend
// ran the sends to completion before posting any receive.

#include "comm_gloo/gloo_test_util.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::testing {
namespace {

TDIST_SCENARIO(batch_isend_irecv_ring) {
  init_process_group(InitProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(30)));
  const int rank = get_rank(), n = get_world_size();
  const int right = (rank + 1) % n, left = (rank - 1 + n) % n;
  at::Tensor to_right = torch::full({7}, rank * 100 + 1.0),
             to_left = torch::full({3}, rank * 100 + 2.0, torch::kLong);
  at::Tensor from_left = torch::zeros({7}), from_right = torch::zeros({3}, torch::kLong);
  std::vector<P2POp> ops{
      P2POp(isend, to_right, right, nullptr, 1), P2POp(isend, to_left, left, nullptr, 2),
      P2POp(irecv, from_left, left, nullptr, 1), P2POp(irecv, from_right, right, nullptr, 2)};
  auto works = batch_isend_irecv(ops);
  EXPECT_EQ(works.size(), ops.size());
  for (auto& w : works) w->wait();
  EXPECT_TRUE(torch::equal(from_left, torch::full({7}, left * 100 + 1.0))) << from_left;
  EXPECT_TRUE(torch::equal(from_right, torch::full({3}, right * 100 + 2.0, torch::kLong)))
      << from_right;
  // Bad batches are refused before anything is sent.
  try {
    batch_isend_irecv({P2POp(isend, to_right, rank)});
    ADD_FAILURE() << "a send to itself was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("is this rank itself"), std::string::npos) << e.what();
  }
  EXPECT_THROW(batch_isend_irecv({}), InvalidArgument);
  destroy_process_group();
}

TEST(BatchIsendIrecv, RingBothWaysAtWorlds2To4) {
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    expect_all_ok(run_ranks_as_processes("batch_isend_irecv_ring", world));
  }
}

TEST(BatchIsendIrecv, OnlyIsendAndIrecvMakeAP2POp) {
  EXPECT_THROW(P2POp(nullptr, torch::zeros({1}), 0), InvalidArgument);
}

}  // namespace
}  // namespace tdist::testing

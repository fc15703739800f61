// Gloo with CUDA tensors (Note [Staging device tensors through the host]): two and three
// processes sharing one GPU run the collectives c10d's Gloo runs on CUDA tensors, staged
// through pinned host memory. Without a GPU every case skips with the reason.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::testing {
namespace {

TDIST_SCENARIO(gloo_cuda_collectives) {
  init_process_group(InitProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(60)));
  const int rank = get_rank(), n = get_world_size();
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  const float tri = n * (n + 1) / 2.0f;
  at::Tensor t = torch::full({1000}, rank + 1.0f, cuda);
  all_reduce(t);
  EXPECT_TRUE(torch::allclose(t.cpu(), torch::full({1000}, tri)));
  at::Tensor b = torch::full({5}, rank == 1 ? 7.0f : 0.0f, cuda.dtype(at::kDouble));
  broadcast(b, 1);
  EXPECT_TRUE(torch::equal(b.cpu(), torch::full({5}, 7.0, at::kDouble)));
  at::Tensor mine = torch::full({3}, float(rank), cuda.dtype(at::kBFloat16));
  at::Tensor all = torch::empty({3 * n}, cuda.dtype(at::kBFloat16));
  all_gather_into_tensor(all, mine);
  for (int r = 0; r < n; ++r) EXPECT_EQ(all[3 * r].item<float>(), float(r));
  at::Tensor in = torch::arange(2 * n, cuda.dtype(at::kFloat)) * float(rank + 1);
  at::Tensor out = torch::empty({2}, cuda);
  reduce_scatter_tensor(out, in);
  EXPECT_EQ(out[0].item<float>(), 2.0f * rank * tri);
  at::Tensor a2a_in = torch::full({n}, float(rank), cuda), a2a_out = torch::empty({n}, cuda);
  all_to_all_single(a2a_out, a2a_in);
  for (int r = 0; r < n; ++r) EXPECT_EQ(a2a_out[r].item<float>(), float(r));
  // Stream order: the staged collective sees the kernel queued just before it.
  at::Tensor queued = torch::zeros({1 << 20}, cuda);
  queued.add_(rank + 1);
  all_reduce(queued);
  EXPECT_EQ(queued[777].item<float>(), tri);
  // Point-to-point on CUDA tensors is not staged (as c10d's gloo): a clear error.
  try {
    send(t, (rank + 1) % n);
    ADD_FAILURE() << "gloo sent a CUDA tensor";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cpu:gloo,cuda:nccl"), std::string::npos) << e.what();
  }
  barrier();
  destroy_process_group();
}

TEST(GlooCuda, CollectivesOnOneSharedGpuAtWorlds2And3) {
  if (!has_gpu()) GTEST_SKIP() << "needs a CUDA GPU; none here";
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    expect_all_ok(run_ranks_as_processes("gloo_cuda_collectives", world));
  }
}

}  // namespace
}  // namespace tdist::testing

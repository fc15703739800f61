// Gloo with CUDA tensors (Note [Staging device tensors through the host]): two and three
// processes sharing one GPU run the collectives c10d's Gloo runs on CUDA tensors, staged
// through pinned host memory. Without a GPU every case skips with the reason; the same
// scenario on CPU tensors (GC_DEVICE=cpu, GlooCudaScenarioOnCpu) runs everywhere, so what the
// CUDA case asserts is itself checked.

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
  const bool on_gpu = env_str("GC_DEVICE", "cuda") == "cuda";
  const auto cuda =
      at::TensorOptions().device(on_gpu ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU));
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
  // The rest of the staged ops (SPEC's "gloo GPU" column), exact at every rank.
  at::Tensor red = torch::full({4}, rank + 1.0f, cuda);
  reduce(red, n - 1);
  if (rank == n - 1) {
    EXPECT_EQ(red[3].item<float>(), tri);
  }
  std::vector<at::Tensor> coalesced{torch::full({3}, float(rank), cuda),
                                    torch::full({2}, float(2 * rank), cuda)};
  all_reduce_coalesced(coalesced, ReduceOp::MAX);
  EXPECT_EQ(coalesced[0][2].item<float>(), float(n - 1));
  EXPECT_EQ(coalesced[1][1].item<float>(), float(2 * (n - 1)));
  std::vector<at::Tensor> pieces;
  for (int r = 0; r < n; ++r) pieces.push_back(torch::empty({2}, cuda.dtype(at::kHalf)));
  all_gather(pieces, torch::full({2}, float(rank), cuda.dtype(at::kHalf)));
  for (int r = 0; r < n; ++r) EXPECT_EQ(pieces[r][1].item<float>(), float(r));
  std::vector<at::Tensor> gathered;
  if (rank == 0) {
    for (int r = 0; r < n; ++r) gathered.push_back(torch::empty({2}, cuda));
  }
  gather(torch::full({2}, rank * 10.0f, cuda), gathered, 0);
  for (int r = 0; rank == 0 && r < n; ++r) EXPECT_EQ(gathered[r][0].item<float>(), r * 10.0f);
  std::vector<at::Tensor> to_scatter;
  if (rank == 0) {
    for (int r = 0; r < n; ++r) to_scatter.push_back(torch::full({3}, r + 0.5f, cuda));
  }
  at::Tensor scattered = torch::empty({3}, cuda);
  scatter(scattered, to_scatter, 0);
  EXPECT_EQ(scattered[2].item<float>(), rank + 0.5f);
  std::vector<at::Tensor> rs_in;
  for (int r = 0; r < n; ++r) rs_in.push_back(torch::full({2}, float(r * (rank + 1)), cuda));
  at::Tensor rs_out = torch::empty({2}, cuda);
  reduce_scatter(rs_out, rs_in);
  EXPECT_EQ(rs_out[1].item<float>(), rank * tri);
  std::vector<at::Tensor> a2a_list_in, a2a_list_out;
  for (int r = 0; r < n; ++r) {
    a2a_list_in.push_back(torch::full({2}, float(10 * rank + r), cuda));
    a2a_list_out.push_back(torch::empty({2}, cuda));
  }
  all_to_all(a2a_list_out, a2a_list_in);
  for (int r = 0; r < n; ++r) EXPECT_EQ(a2a_list_out[r][0].item<float>(), float(10 * r + rank));
  // Uneven splits, rank 0 sending nothing: every other rank sends each peer (rank) rows of 2.
  const int64_t sent_rows = rank == 0 ? 0 : n * (n - 1) / 2;
  std::vector<int64_t> in_splits(n), out_splits(n);
  for (int r = 0; r < n; ++r) {
    in_splits[r] = rank == 0 ? 0 : r;
    out_splits[r] = r == 0 ? 0 : rank;
  }
  at::Tensor uneven_in = torch::full({sent_rows, 2}, float(rank), cuda);
  at::Tensor uneven_out = torch::full({(n - 1) * rank, 2}, -1.0f, cuda);
  all_to_all_single(uneven_out, uneven_in, out_splits, in_splits);
  for (int r = 1, row = 0; r < n; ++r) {
    for (int k = 0; k < rank; ++k, ++row) EXPECT_EQ(uneven_out[row][1].item<float>(), float(r));
  }
  // An output dropped right after the call: its memory is not reused before the copy back.
  for (int i = 0; i < 5; ++i) {
    at::Tensor temp = torch::full({1 << 18}, float(i), cuda);
    all_reduce(temp);
    temp = at::Tensor();
    at::Tensor other = torch::full({1 << 18}, -1.0f, cuda);
    EXPECT_EQ(other[5].item<float>(), -1.0f);
  }
  // Stream order: the staged collective sees the kernel queued just before it.
  at::Tensor queued = torch::zeros({1 << 20}, cuda);
  queued.add_(rank + 1);
  all_reduce(queued);
  EXPECT_EQ(queued[777].item<float>(), tri);
  // Point-to-point on CUDA tensors is not staged (as c10d's gloo): a clear error.
  if (on_gpu) {
    const std::string what = error_of([&] { send(t, (rank + 1) % n); });
    EXPECT_NE(what.find("cpu:gloo,cuda:nccl"), std::string::npos) << what;
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

TEST(GlooCudaScenarioOnCpu, TheSameAssertionsHoldOnCpuTensors) {
  ProcessOptions options;
  options.env["GC_DEVICE"] = "cpu";
  expect_all_ok_at_worlds("gloo_cuda_collectives", {2, 3}, options);
}

}  // namespace
}  // namespace tdist::testing

// The NCCL backend on a GPU, at world 1 (NCCL refuses two ranks on one GPU; multi-rank CUDA
// paths are tested over Gloo in test_gloo_cuda): every op and dtype through
// init_process_group, c10d's stream semantics, and the tensor lifetime rules. Without a GPU
// every case skips with the reason (ctest reports the binary skipped).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tdist/comm/distributed.h"
#include "tdist/comm/split_group.h"
#include "tdist/error.h"
#include "tdist/store/hash_store.h"

namespace tdist {
namespace {

class NcclWorld1 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!(at::hasCUDA() && at::getNumGPUs() > 0)) GTEST_SKIP() << "needs a CUDA GPU; none here";
    init_process_group(InitProcessGroupOptions()
                           .backend("cpu:gloo,cuda:nccl")
                           .device_id("cuda:0")
                           .store(std::make_shared<HashStore>())
                           .rank(0)
                           .world_size(1));
  }
  void TearDown() override {
    if (is_initialized()) destroy_process_group();
  }
  at::TensorOptions cuda(at::ScalarType type = at::kFloat) const {
    return at::TensorOptions().device(at::kCUDA, 0).dtype(type);
  }
};

TEST_F(NcclWorld1, EveryReduceOpAndDtype) {
  for (auto type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong,
                    at::kChar, at::kByte}) {
    for (auto op : {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX}) {
      at::Tensor t = torch::arange(1, 6, cuda(type));
      const at::Tensor want = t.clone();
      all_reduce(t, op);
      EXPECT_TRUE(torch::equal(t.cpu(), want.cpu())) << c10::toString(type) << " " << to_string(op);
    }
  }
  at::Tensor f = torch::full({4}, 3.0, cuda());
  all_reduce(f, ReduceOp::AVG);
  EXPECT_TRUE(torch::allclose(f.cpu(), torch::full({4}, 3.0)));
  at::Tensor i = torch::ones({4}, cuda(at::kInt));
  EXPECT_THROW(all_reduce(i, ReduceOp::AVG), InvalidArgument);
  EXPECT_THROW(all_reduce(i, ReduceOp::BXOR), InvalidArgument);
}

// Note [Aborting on a lost peer]: what heartbeats do on a loss. The abort interrupts (true),
// and every later collective on the group raises DistBackendError naming the reason.
TEST_F(NcclWorld1, AnAbortRaisesTheReasonFromEveryLaterCollective) {
  at::Tensor t = torch::ones({8}, cuda());
  all_reduce(t);
  EXPECT_TRUE(group_world()->backend("cuda").abort("rank 1 (host, pid 7) is lost"));
  for (int i = 0; i < 2; ++i) {
    try {
      all_reduce(t);
      ADD_FAILURE() << "an aborted group ran a collective";
    } catch (const DistBackendError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 (host, pid 7) is lost"), std::string::npos)
          << e.what();
    }
  }
}

TEST_F(NcclWorld1, EveryCollectiveAtWorld1) {
  at::Tensor x = torch::arange(12, cuda()).reshape({4, 3});
  at::Tensor b = x.clone();
  broadcast(b, 0);
  EXPECT_TRUE(torch::equal(b.cpu(), x.cpu()));
  at::Tensor r = x.clone();
  reduce(r, 0);
  EXPECT_TRUE(torch::equal(r.cpu(), x.cpu()));
  at::Tensor gathered = torch::empty({4, 3}, cuda());
  all_gather_into_tensor(gathered, x);
  EXPECT_TRUE(torch::equal(gathered.cpu(), x.cpu()));
  std::vector<at::Tensor> list{torch::empty({4, 3}, cuda())};
  all_gather(list, x);
  EXPECT_TRUE(torch::equal(list[0].cpu(), x.cpu()));
  at::Tensor scattered = torch::empty({4, 3}, cuda());
  reduce_scatter_tensor(scattered, x);
  EXPECT_TRUE(torch::equal(scattered.cpu(), x.cpu()));
  at::Tensor a2a = torch::empty({4, 3}, cuda());
  all_to_all_single(a2a, x);
  EXPECT_TRUE(torch::equal(a2a.cpu(), x.cpu()));
  std::vector<at::Tensor> coalesced{torch::ones({5}, cuda(at::kLong)),
                                    torch::ones({2}, cuda(at::kLong))};
  all_reduce_coalesced(coalesced)->wait();
  EXPECT_EQ(coalesced[1].sum().item<int64_t>(), 2);
  barrier();
  EXPECT_EQ(group_world()->backend_names().at("cuda"), "nccl");
  EXPECT_EQ(group_world()->backend_names().at("cpu"), "gloo");
  at::Tensor on_cpu = torch::ones({3});
  all_reduce(on_cpu);  // routed to gloo
  EXPECT_TRUE(torch::equal(on_cpu, torch::ones({3})));
}

// Every op of SPEC's NCCL table on every dtype NCCL takes: at world 1 each op's result is
// its input, so the check is exact, whatever the dtype.
void every_op_on_every_dtype(const c10::Device& device) {
  auto on = [&](at::ScalarType type) { return at::TensorOptions().device(device).dtype(type); };
  for (auto type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kByte,
                    at::kInt, at::kLong, at::kBool}) {
    SCOPED_TRACE(c10::toString(type));
    const at::Tensor x = torch::arange(1, 7, on(at::kLong)).remainder(5).to(type).reshape({3, 2});
    auto empty = [&] { return torch::empty({3, 2}, on(type)); };
    auto expect_x = [&](const at::Tensor& got, const char* op) {
      EXPECT_TRUE(torch::equal(got.cpu(), x.cpu())) << op;
    };
    at::Tensor t = x.clone();
    broadcast(t, 0);
    expect_x(t, "broadcast");
    all_reduce(t);
    expect_x(t, "all_reduce");
    reduce(t, 0, ReduceOp::MAX);
    expect_x(t, "reduce");
    std::vector<at::Tensor> coalesced{x.clone(), x.clone()};
    all_reduce_coalesced(coalesced, ReduceOp::MIN);
    expect_x(coalesced[1], "all_reduce_coalesced");
    at::Tensor out = empty();
    all_gather_into_tensor(out, x);
    expect_x(out, "all_gather_into_tensor");
    std::vector<at::Tensor> list{empty()};
    all_gather(list, x);
    expect_x(list[0], "all_gather");
    list = {empty()};
    gather(x, list, 0);
    expect_x(list[0], "gather");
    out = empty();
    scatter(out, {x}, 0);
    expect_x(out, "scatter");
    out = empty();
    reduce_scatter_tensor(out, x);
    expect_x(out, "reduce_scatter_tensor");
    out = empty();
    reduce_scatter(out, {x});
    expect_x(out, "reduce_scatter");
    out = empty();
    all_to_all_single(out, x, {3}, {3});
    expect_x(out, "all_to_all_single");
    list = {empty()};
    all_to_all(list, {x});
    expect_x(list[0], "all_to_all");
    if (!device.is_cuda()) continue;  // gloo has no point-to-point to itself
    // Batched point-to-point, to itself on the backend (the frontend refuses a rank its own
    // peer): one NCCL group holds the send and its matching receive.
    out = empty();
    std::vector<PointToPoint> batch(2);
    batch[0] = {true, x, 0};
    batch[1] = {false, out, 0};
    group_world()->backend("cuda").batch_send_recv(batch, {})->wait();
    expect_x(out, "batch_send_recv");
  }
}

TEST_F(NcclWorld1, EveryOpOnEveryDtype) {
  every_op_on_every_dtype(c10::Device(c10::kCUDA, 0));
}

// Note [Stream semantics]: the collective sees what the caller queued before it on its
// current stream, and the caller's later kernels see the collective's result, with no host
// synchronisation in between.
TEST_F(NcclWorld1, CollectivesAreOrderedOnTheCallersStream) {
  at::Tensor t = torch::zeros({1 << 22}, cuda());
  for (int i = 0; i < 8; ++i) {
    t.add_(1);  // queued on the current stream
    auto work = all_reduce(t, ReduceOp::SUM, nullptr, /*async_op=*/true);
    work->wait();  // the current stream waits; the host does not
    t.mul_(2);
  }
  // ((((0+1)*2+1)*2 ...): 8 rounds of x -> 2(x+1) from 0 is 2^9 - 2.
  EXPECT_EQ(t[12345].item<float>(), 510.0f);
}

TEST_F(NcclWorld1, TensorsDroppedRightAfterTheCallStayValidUntilTheCollectiveIsDone) {
  // The caching allocator must not reuse a tensor's memory while the communication stream
  // may still read it (recordStream).
  for (int i = 0; i < 20; ++i) {
    at::Tensor temp = torch::full({1 << 20}, float(i), cuda());
    all_reduce(temp, ReduceOp::SUM, nullptr, true);
    temp = at::Tensor();
    at::Tensor other = torch::full({1 << 20}, -1.0f, cuda());
    EXPECT_EQ(other[0].item<float>(), -1.0f);
  }
}

TEST_F(NcclWorld1, ATensorOnAnotherDeviceOrCpuIsRefusedByNccl) {
  at::Tensor t = torch::ones({2}, cuda());
  auto& nccl = group_world()->backend("cuda");
  at::Tensor on_cpu = torch::ones({2});
  EXPECT_THROW(nccl.all_reduce(on_cpu, {}), InvalidArgument);
}

// A rank's block to itself is a local copy, not a send through NCCL: a copy between blocks of
// different sizes would broadcast or fail in LibTorch, so the backend names the mismatch.
TEST_F(NcclWorld1, AllToAllRefusesASelfBlockOfAnotherSize) {
  auto& nccl = group_world()->backend("cuda");
  std::vector<at::Tensor> outputs{torch::zeros({2}, cuda())};
  try {
    nccl.all_to_all(outputs, {torch::ones({1}, cuda())}, {});
    FAIL() << "all_to_all with a 1-element block to itself and a 2-element one back passed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sends itself 1 elements"), std::string::npos) << e.what();
  }
  EXPECT_EQ(outputs[0].sum().item<float>(), 0.0f);  // nothing was written
}

// PREMUL_SUM in NCCL's kernels (ncclRedOpCreatePreMulSum), with a host scalar and a device
// factor; all_gather_coalesced; split_group through ncclCommSplit; recv from any source refused.
TEST_F(NcclWorld1, PremulSumSplitAndCoalescedGatherAtWorld1) {
  EXPECT_EQ(get_backend_config(), "cpu:gloo,cuda:nccl");
  for (const auto& op : {make_nccl_premul_sum(0.5), make_nccl_premul_sum(torch::full({1}, 0.5))}) {
    for (auto type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
      at::Tensor t = torch::arange(1, 9, cuda(type));
      all_reduce(t, op);
      EXPECT_TRUE(torch::equal(t.cpu(), (torch::arange(1, 9, at::kDouble) * 0.5).to(type)))
          << c10::toString(type);
      at::Tensor out = torch::zeros({8}, cuda(type));
      reduce_scatter_tensor(out, torch::full({8}, 4.0, cuda(type)), op);
      EXPECT_TRUE(torch::equal(out.cpu(), torch::full({8}, 2.0, type)));
    }
  }
  at::Tensor ints = torch::ones({2}, cuda(at::kInt));
  EXPECT_THROW(all_reduce(ints, make_nccl_premul_sum(2.0)), InvalidArgument);
  auto& nccl = group_world()->backend("cuda");
  EXPECT_TRUE(nccl.supports_premul_sum());
  EXPECT_THROW(nccl.recv_anysource(ints, {}), InvalidArgument);

  std::vector<std::vector<at::Tensor>> outputs{
      {torch::empty({2, 2}, cuda()), torch::empty({3}, cuda())}};
  all_gather_coalesced(outputs, {torch::ones({2, 2}, cuda()), torch::full({3}, 2.0, cuda())});
  EXPECT_TRUE(torch::equal(outputs[0][1].cpu(), torch::full({3}, 2.0)));

  const ProcessGroupPtr split = split_group(nullptr, {{0}});
  ASSERT_NE(split, nullptr);
  EXPECT_EQ(split->backend_names().at("cuda"), "nccl");
  at::Tensor t = torch::full({4}, 3.0, cuda());
  all_reduce(t, ReduceOp::SUM, split);
  EXPECT_EQ(t[0].item<float>(), 3.0f);
}

// The dtype sweep on CPU tensors over gloo: what the NCCL case asserts is checked everywhere.
TEST(NcclScenarioOnCpu, EveryOpOnEveryDtypeOverGloo) {
  init_process_group(InitProcessGroupOptions()
                         .backend("gloo")
                         .store(std::make_shared<HashStore>())
                         .rank(0)
                         .world_size(1));
  every_op_on_every_dtype(c10::Device(c10::kCPU));
  destroy_process_group();
}

}  // namespace
}  // namespace tdist

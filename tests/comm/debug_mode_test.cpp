// TDIST_DEBUG=DETAIL: mismatched collectives raise on every rank naming both sides; matching
// ones pass. Without it, a mismatch detectable locally still raises instead of aborting.
#include <torch/torch.h>

#include <mutex>

#include "comm/comm_test_util.h"
#include "tdist/comm/backend.h"
#include "tdist/comm/process_group.h"

namespace tdist {
namespace {

using namespace tdist::testing;

TDIST_SCENARIO(comm_debug_shape_mismatch) {
  init_process_group(test_init_options());
  const int rank = get_rank(), n = get_world_size();
  // A group with a CPU backend keeps host-made control values on the host.
  EXPECT_EQ(get_default_device(), c10::Device(c10::kCPU));
  const at::Tensor flag = torch::ones({1});
  EXPECT_TRUE(to_collective_device(flag).is_same(flag));
  // Matching calls pass the check.
  at::Tensor ok = torch::ones({4});
  all_reduce(ok);
  EXPECT_EQ(ok[0].item<float>(), n);
  // The last rank disagrees on the shape.
  at::Tensor t = torch::ones({rank == n - 1 ? 5 : 4});
  all_reduce(t);  // must throw on every rank
}

/// `scenario` at world `n` under TDIST_DEBUG=DETAIL.
std::vector<RankResult> run_detailed(const std::string& scenario, int n) {
  auto opts = short_run();
  opts.env["TDIST_DEBUG"] = "DETAIL";
  return run_ranks_as_processes(scenario, n, opts);
}

TEST(DebugMode, ShapeMismatchRaisesOnEveryRankNamingBothSides) {
  for (int n : {2, 3}) {
    auto results = run_detailed("comm_debug_shape_mismatch", n);
    expect_failed_with(results, "TDIST_DEBUG=DETAIL found a collective mismatch");
    expect_failed_with(results, "all_reduce(dtype=Float, shape=[4], op=SUM)");
    expect_failed_with(results, "global rank " + std::to_string(n - 1) +
                                    " called all_reduce(dtype=Float, shape=[5], op=SUM)");
  }
}

TDIST_SCENARIO(comm_debug_op_mismatch) {
  init_process_group(test_init_options());
  at::Tensor t = torch::ones({2}, torch::kInt32);
  if (get_rank() == 0) {
    broadcast(t, 0);
  } else {
    all_reduce(t.to(torch::kFloat64));
  }
}

TEST(DebugMode, OpAndDtypeMismatchRaises) {
  auto results = run_detailed("comm_debug_op_mismatch", 2);
  expect_failed_with(results, "broadcast(dtype=Int, shape=[2], root=0)");
  expect_failed_with(results, "all_reduce(dtype=Double, shape=[2], op=SUM)");
}

// A group whose only backend serves a device (as an "nccl" group serves "cuda"): here a
// stand-in on "meta" tensors that, like NCCL, refuses host tensors. Its collectives do
// nothing; the signature check must not go through it.
class MetaBackend : public CollectiveBackend {
 public:
  MetaBackend(int rank, int size) : CollectiveBackend(rank, size) {}
  std::string name() const override { return "metatest"; }
  bool takes_device_tensors(c10::DeviceType type) const override { return type == c10::kMeta; }
  WorkPtr all_reduce(at::Tensor& tensor, const AllreduceOptions&) override {
    refuse_host(tensor);
    return completed_work("all_reduce", {tensor});
  }
  WorkPtr all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                                 const AllgatherOptions&) override {
    refuse_host(input);
    return completed_work("all_gather_into_tensor", {output});
  }
  WorkPtr barrier(const BarrierOptions&) override { return completed_work("barrier"); }

 private:
  static void refuse_host(const at::Tensor& t) {
    TDIST_CHECK_ARG(t.device().is_meta(), "metatest takes meta tensors, got " + t.device().str());
  }
};

void register_meta_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    Backend::register_backend("metatest",
                              [](const StorePtr&, int rank, int size, std::chrono::milliseconds) {
                                return std::make_shared<MetaBackend>(rank, size);
                              },
                              true, {"meta"});
  });
}

TDIST_SCENARIO(comm_debug_device_only_group) {
  register_meta_backend();
  init_process_group(test_init_options().backend("meta:metatest"));
  const int rank = get_rank(), n = get_world_size();
  // Control values of the library (flags, counts) go to the group's device, not the host.
  EXPECT_EQ(get_default_device(), c10::Device(c10::kMeta));
  EXPECT_TRUE(to_collective_device(torch::ones({1})).is_meta());
  const at::Tensor already = torch::empty({1}, at::kMeta);
  EXPECT_TRUE(to_collective_device(already).is_same(already));
  for (int i = 0; i < 3; ++i) {
    at::Tensor ok = torch::empty({4}, at::kMeta);
    all_reduce(ok);
  }
  // The check went through the store, and each rank removed its own earlier keys.
  Store& store = *group_world()->store();
  const uint64_t seq = group_world()->sequence_number();
  auto key = [&](uint64_t s) {
    return "signature_check/" + std::to_string(s) + "/" + std::to_string(rank);
  };
  EXPECT_TRUE(store.check({key(seq)}));
  EXPECT_FALSE(store.check({key(seq - 1)}));
  EXPECT_FALSE(store.check({key(seq - 2)}));
  at::Tensor t = torch::empty({rank == n - 1 ? 5 : 4}, at::kMeta);
  all_reduce(t);  // must throw on every rank
}

TEST(DebugMode, ADeviceOnlyGroupIsCheckedThroughItsStoreAndKeepsControlValuesOnItsDevice) {
  for (int n : {2, 3}) {
    auto results = run_detailed("comm_debug_device_only_group", n);
    expect_failed_with(results, "TDIST_DEBUG=DETAIL found a collective mismatch");
    expect_failed_with(results, "global rank " + std::to_string(n - 1) +
                                    " called all_reduce(dtype=Float, shape=[5], op=SUM)");
    for (const auto& r : results) {
      EXPECT_EQ(r.output.find("Failure"), std::string::npos) << r.output;
      EXPECT_EQ(r.output.find("metatest takes meta tensors"), std::string::npos) << r.output;
    }
  }
}

TDIST_SCENARIO(comm_debug_bad_level) {
  init_process_group(test_init_options());
}

TEST(DebugMode, UnknownLevelIsNamed) {
  auto opts = short_run();
  opts.env["TDIST_DEBUG"] = "VERBOSE";
  expect_failed_with(run_ranks_as_processes("comm_debug_bad_level", 1, opts),
                     "TDIST_DEBUG='VERBOSE' is not a debug level");
}

}  // namespace
}  // namespace tdist

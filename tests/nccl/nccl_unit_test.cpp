// What of the NCCL backend runs without a GPU: how dtypes and reduce ops map to NCCL's, which
// GPU a rank binds, the options from the environment, the registration, and the errors a
// user meets on a machine without a GPU.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "nccl/all_to_all_plan.h"
#include "nccl/device_choice.h"
#include "nccl/nccl_types.h"
#include "nccl/reduction.h"
#include "support/expect.h"
#include "support/scoped_env.h"
#include "tdist/comm/backend.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/nccl/nccl_backend.h"
#include "tdist/store/hash_store.h"

namespace tdist::nccl {
namespace {

using detail::choose_device_index;
using detail::nccl_dtype;
using detail::nccl_reduce_op;
using detail::plan_all_to_all_single;

using tdist::testing::error_of;
using tdist::testing::has_gpu;

TEST(NcclTypes, EveryDtypeNcclTakesMapsToItsType) {
  EXPECT_EQ(nccl_dtype(at::kFloat), ncclFloat32);
  EXPECT_EQ(nccl_dtype(at::kDouble), ncclFloat64);
  EXPECT_EQ(nccl_dtype(at::kHalf), ncclFloat16);
  EXPECT_EQ(nccl_dtype(at::kBFloat16), ncclBfloat16);
  EXPECT_EQ(nccl_dtype(at::kChar), ncclInt8);
  EXPECT_EQ(nccl_dtype(at::kByte), ncclUint8);
  EXPECT_EQ(nccl_dtype(at::kBool), ncclUint8);
  EXPECT_EQ(nccl_dtype(at::kInt), ncclInt32);
  EXPECT_EQ(nccl_dtype(at::kLong), ncclInt64);
  const std::string what = error_of([] { nccl_dtype(at::kComplexFloat); });
  EXPECT_NE(what.find("ComplexFloat"), std::string::npos) << what;
  EXPECT_NE(what.find("bfloat16"), std::string::npos) << what;
}

TEST(NcclTypes, ReduceOpsAsC10dMapsThem) {
  EXPECT_EQ(nccl_reduce_op(ReduceOp::SUM, at::kFloat), ncclSum);
  EXPECT_EQ(nccl_reduce_op(ReduceOp::PRODUCT, at::kLong), ncclProd);
  EXPECT_EQ(nccl_reduce_op(ReduceOp::MIN, at::kHalf), ncclMin);
  EXPECT_EQ(nccl_reduce_op(ReduceOp::MAX, at::kInt), ncclMax);
  // AVG is NCCL's own average, for floating types only.
  EXPECT_EQ(nccl_reduce_op(ReduceOp::AVG, at::kBFloat16), ncclAvg);
  EXPECT_NE(error_of([] { nccl_reduce_op(ReduceOp::AVG, at::kInt); }).find("AVG of Int"),
            std::string::npos);
  // bool: SUM is a logical or, PRODUCT a logical and.
  EXPECT_EQ(nccl_reduce_op(ReduceOp::SUM, at::kBool), ncclMax);
  EXPECT_EQ(nccl_reduce_op(ReduceOp::PRODUCT, at::kBool), ncclMin);
  for (auto op : {ReduceOp::BAND, ReduceOp::BOR, ReduceOp::BXOR}) {
    const std::string what = error_of([&] { nccl_reduce_op(op, at::kInt); });
    EXPECT_NE(what.find("not supported by NCCL"), std::string::npos) << what;
    EXPECT_NE(what.find("cpu:gloo,cuda:nccl"), std::string::npos) << what;
  }
}

// PREMUL_SUM is made per call (nccl/reduction.h), for the dtypes c10d takes it on; every
// refusal comes before a communicator is touched.
TEST(NcclTypes, PremulSumIsMadePerCallForFloatingTypes) {
  EXPECT_NE(
      error_of([] { nccl_reduce_op(ReduceOp::PREMUL_SUM, at::kFloat); }).find("made per call"),
      std::string::npos);
  const std::string ints =
      error_of([] { detail::Reduction(make_nccl_premul_sum(2.0), torch::ones({2}, at::kInt)); });
  EXPECT_NE(ints.find("PREMUL_SUM of Int tensors is not supported"), std::string::npos) << ints;
  const std::string bare =
      error_of([] { detail::Reduction(ReduceOp::PREMUL_SUM, torch::ones({2})); });
  EXPECT_NE(bare.find("needs its factor"), std::string::npos) << bare;
  EXPECT_TRUE(detail::Reduction(make_nccl_premul_sum(2.0), torch::ones({2})).tensors().empty());
  const detail::Reduction on_device_factor(make_nccl_premul_sum(torch::full({1}, 2.0)),
                                           torch::ones({2}, at::kHalf));
  ASSERT_EQ(on_device_factor.tensors().size(), 1u);
  EXPECT_EQ(on_device_factor.tensors()[0].scalar_type(), at::kHalf);
  EXPECT_TRUE(detail::Reduction(ReduceOp::SUM, torch::ones({2})).tensors().empty());
}

TEST(NcclAllToAllPlan, EvenSplitsCutDimZeroIntoEqualBlocksOfWholeRows) {
  const auto plan = plan_all_to_all_single({6, 2}, {6, 2}, {}, {}, 3, 1);
  EXPECT_EQ(plan.send.offset, (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(plan.send.count, (std::vector<int64_t>{4, 4, 4}));
  EXPECT_EQ(plan.recv.offset, plan.send.offset);
  EXPECT_EQ(plan.recv.count, plan.send.count);
  const auto flat = plan_all_to_all_single({4}, {4}, {}, {}, 4, 0);
  EXPECT_EQ(flat.send.count, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(flat.recv.offset, (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(NcclAllToAllPlan, UnevenSplitsCountRowsOfEachSidesOwnWidth) {
  // Rank 1 of 3 sends nothing (an input with no rows) but receives 2 and 3 rows of 4.
  const auto plan = plan_all_to_all_single({0, 4}, {5, 4}, {0, 0, 0}, {2, 0, 3}, 3, 1);
  EXPECT_EQ(plan.send.count, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(plan.recv.offset, (std::vector<int64_t>{0, 8, 8}));
  EXPECT_EQ(plan.recv.count, (std::vector<int64_t>{8, 0, 12}));
  // And the other way round: rows out, none back.
  const auto back = plan_all_to_all_single({3, 2, 2}, {0, 2, 2}, {1, 0, 2}, {0, 0, 0}, 3, 1);
  EXPECT_EQ(back.send.offset, (std::vector<int64_t>{0, 4, 4}));
  EXPECT_EQ(back.send.count, (std::vector<int64_t>{4, 0, 8}));
  EXPECT_EQ(back.recv.count, (std::vector<int64_t>{0, 0, 0}));
}

TEST(NcclAllToAllPlan, RowsOfDifferentWidthsOrASelfBlockMismatchAreRefused) {
  std::string what = error_of([] { plan_all_to_all_single({4, 3}, {4, 2}, {}, {}, 2, 0); });
  EXPECT_NE(what.find("input rows have 3 elements but output rows have 2"), std::string::npos)
      << what;
  what = error_of([] { plan_all_to_all_single({3}, {3}, {2, 1}, {1, 2}, 2, 0); });
  EXPECT_NE(what.find("sends itself 2 elements but expects 1"), std::string::npos) << what;
}

TEST(NcclDeviceChoice, RequestedThenDeviceIdThenLocalRankThenRankModuloCount) {
  EXPECT_EQ(choose_device_index(2, "cuda:1", "0", 5, 4), 2);
  EXPECT_EQ(choose_device_index(-1, "cuda:1", "0", 5, 4), 1);
  EXPECT_EQ(choose_device_index(-1, "cuda", "3", 5, 4), 3);
  EXPECT_EQ(choose_device_index(-1, "", "3", 5, 4), 3);
  EXPECT_EQ(choose_device_index(-1, "", "", 5, 4), 1);
  EXPECT_EQ(choose_device_index(-1, "", "", 0, 1), 0);
  // One GPU visible per process (CUDA_VISIBLE_DEVICES per task): it, whatever LOCAL_RANK says;
  // without CUDA_VISIBLE_DEVICES a second local rank on one GPU stays an error.
  EXPECT_EQ(choose_device_index(-1, "", "3", 3, 1, /*visible_devices_set=*/true), 0);
  EXPECT_THROW(choose_device_index(-1, "", "1", 1, 1, /*visible_devices_set=*/false),
               InvalidArgument);
  // An explicit device_id is still checked against what the process sees.
  EXPECT_THROW(choose_device_index(-1, "cuda:3", "3", 3, 1, true), InvalidArgument);
}

TEST(NcclDeviceChoice, BadChoicesNameTheProblemAndTheFix) {
  std::string what = error_of([] { choose_device_index(-1, "", "0", 0, 0); });
  EXPECT_NE(what.find("no CUDA GPU"), std::string::npos) << what;
  EXPECT_NE(what.find("gloo"), std::string::npos) << what;
  EXPECT_THROW(choose_device_index(-1, "", "0", 0, 0), DistBackendError);
  what = error_of([] { choose_device_index(-1, "", "2", 2, 2); });
  EXPECT_NE(what.find("LOCAL_RANK=2 names cuda:2"), std::string::npos) << what;
  EXPECT_NE(what.find("sees 2 GPU(s)"), std::string::npos) << what;
  what = error_of([] { choose_device_index(-1, "cuda:x", "", 0, 2); });
  EXPECT_NE(what.find("malformed"), std::string::npos) << what;
  what = error_of([] { choose_device_index(-1, "cpu", "", 0, 2); });
  EXPECT_NE(what.find("not a CUDA device"), std::string::npos) << what;
  what = error_of([] { choose_device_index(-1, "", "-1", 0, 2); });
  EXPECT_NE(what.find("LOCAL_RANK='-1'"), std::string::npos) << what;
}

using tdist::testing::ScopedEnv;

TEST(NcclOptions, TheEnvironmentAsC10dReadsIt) {
  {
    const NCCLBackendOptions defaults = nccl_options_from_env();
    EXPECT_FALSE(defaults.blocking_wait());
    EXPECT_TRUE(defaults.tear_down_on_error());
    EXPECT_FALSE(defaults.high_priority_stream());
  }
  ScopedEnv blocking("TORCH_NCCL_BLOCKING_WAIT", "1");
  ScopedEnv handling("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0");
  ScopedEnv priority("TORCH_NCCL_HIGH_PRIORITY", "1");
  ScopedEnv interval("TDIST_NCCL_WATCHDOG_INTERVAL_MS", "250");
  const NCCLBackendOptions o = nccl_options_from_env();
  EXPECT_TRUE(o.blocking_wait());
  EXPECT_FALSE(o.tear_down_on_error());
  EXPECT_TRUE(o.high_priority_stream());
  EXPECT_EQ(o.watchdog_interval(), std::chrono::milliseconds(250));
  ScopedEnv bad("TORCH_NCCL_BLOCKING_WAIT", "yes please");
  const std::string what = error_of([] { nccl_options_from_env(); });
  EXPECT_NE(what.find("TORCH_NCCL_BLOCKING_WAIT='yes please'"), std::string::npos) << what;
}

TEST(NcclOptions, AsyncErrorHandlingModesAsC10dDefinesThem) {
  // 1 (tear down) and 3 (skip clean-up) end the process; 0 and 2 (clean up only) raise.
  for (const auto& [mode, ends] : std::vector<std::pair<const char*, bool>>{
           {"0", false}, {"1", true}, {"2", false}, {"3", true}}) {
    ScopedEnv handling("TORCH_NCCL_ASYNC_ERROR_HANDLING", mode);
    EXPECT_EQ(nccl_options_from_env().tear_down_on_error(), ends) << mode;
  }
  ScopedEnv handling("TORCH_NCCL_ASYNC_ERROR_HANDLING", "4");
  const std::string what = error_of([] { nccl_options_from_env(); });
  EXPECT_NE(what.find("TORCH_NCCL_ASYNC_ERROR_HANDLING='4'"), std::string::npos) << what;
}

TEST(NcclOptions, AWatchdogIntervalOutOfRangeIsRefused) {
  for (const char* value : {"0", "-5", "abc", "100000"}) {
    ScopedEnv interval("TDIST_NCCL_WATCHDOG_INTERVAL_MS", value);
    EXPECT_THROW(nccl_options_from_env(), InvalidArgument) << value;
  }
}

TEST(NcclRegistration, RegisteredForCudaWithTheNcclLibTorchLoads) {
  EXPECT_TRUE(is_nccl_available());
  const auto capability = Backend::backend_capability();
  ASSERT_TRUE(capability.count("nccl"));
  EXPECT_EQ(capability.at("nccl"), std::vector<std::string>{"cuda"});
  // One NCCL per process: the one compiled against is the one loaded.
  EXPECT_EQ(nccl_version_compiled(), nccl_version_loaded());
}

TEST(NcclWithoutGpu, InitProcessGroupNcclSaysThereIsNoGpu) {
  if (has_gpu()) GTEST_SKIP() << "this machine has a GPU";
  const std::string what = error_of([] {
    init_process_group(InitProcessGroupOptions()
                           .backend("nccl")
                           .store(std::make_shared<HashStore>())
                           .rank(0)
                           .world_size(1));
  });
  EXPECT_NE(what.find("no CUDA GPU"), std::string::npos) << what;
  EXPECT_FALSE(is_initialized());
}

TEST(NcclWithoutGpu, TheDefaultBackendIsGlooAloneWhereThereIsNoGpu) {
  if (has_gpu()) GTEST_SKIP() << "this machine has a GPU";
  init_process_group(
      InitProcessGroupOptions().store(std::make_shared<HashStore>()).rank(0).world_size(1));
  const auto names = group_world()->backend_names();
  EXPECT_EQ(names, (std::map<std::string, std::string>{{"cpu", "gloo"}}));
  at::Tensor t = torch::ones({3});
  all_reduce(t);
  EXPECT_TRUE(torch::equal(t, torch::ones({3})));
  destroy_process_group();
}

TEST(NcclWithoutGpu, ADeviceIdOnCudaNamesTheMissingGpu) {
  if (has_gpu()) GTEST_SKIP() << "this machine has a GPU";
  const std::string what = error_of([] {
    init_process_group(InitProcessGroupOptions()
                           .device_id("cuda:0")
                           .store(std::make_shared<HashStore>())
                           .rank(0)
                           .world_size(1));
  });
  EXPECT_NE(what.find("no CUDA GPU"), std::string::npos) << what;
  EXPECT_FALSE(is_initialized());
}

}  // namespace
}  // namespace tdist::nccl

// What of the NCCL backend runs without a GPU: how dtypes and reduce ops map to NCCL's, which
// GPU a rank binds, the options from the environment, the registration, and the errors a
// user meets on a machine without a GPU.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "nccl/device_choice.h"
#include "nccl/nccl_types.h"
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

TEST(NcclDeviceChoice, RequestedThenDeviceIdThenLocalRankThenRankModuloCount) {
  EXPECT_EQ(choose_device_index(2, "cuda:1", "0", 5, 4), 2);
  EXPECT_EQ(choose_device_index(-1, "cuda:1", "0", 5, 4), 1);
  EXPECT_EQ(choose_device_index(-1, "cuda", "3", 5, 4), 3);
  EXPECT_EQ(choose_device_index(-1, "", "3", 5, 4), 3);
  EXPECT_EQ(choose_device_index(-1, "", "", 5, 4), 1);
  EXPECT_EQ(choose_device_index(-1, "", "", 0, 1), 0);
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

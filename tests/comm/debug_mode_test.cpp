// TDIST_DEBUG=DETAIL: mismatched collectives raise on every rank naming both sides; matching
// ones pass. Without it, a mismatch detectable locally still raises instead of aborting.
#include <torch/torch.h>

#include "comm/comm_test_util.h"

namespace tdist {
namespace {

using namespace tdist::testing;

TDIST_SCENARIO(comm_debug_shape_mismatch) {
  init_process_group(test_init_options());
  const int rank = get_rank(), n = get_world_size();
  // Matching calls pass the check.
  at::Tensor ok = torch::ones({4});
  all_reduce(ok);
  EXPECT_EQ(ok[0].item<float>(), n);
  // The last rank disagrees on the shape.
  at::Tensor t = torch::ones({rank == n - 1 ? 5 : 4});
  all_reduce(t);  // must throw on every rank
}

TEST(DebugMode, ShapeMismatchRaisesOnEveryRankNamingBothSides) {
  for (int n : {2, 3}) {
    auto opts = short_run();
    opts.env["TDIST_DEBUG"] = "DETAIL";
    auto results = run_ranks_as_processes("comm_debug_shape_mismatch", n, opts);
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
  auto opts = short_run();
  opts.env["TDIST_DEBUG"] = "DETAIL";
  auto results = run_ranks_as_processes("comm_debug_op_mismatch", 2, opts);
  expect_failed_with(results, "broadcast(dtype=Int, shape=[2], root=0)");
  expect_failed_with(results, "all_reduce(dtype=Double, shape=[2], op=SUM)");
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

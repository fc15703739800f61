// The same-host shared-memory path of the Gloo engine (src/gloo/shm.h) against the TCP
// path: both give the expected results for every dtype and op (all_reduce, reduce_scatter,
// all_gather, broadcast, even all_to_all_single), segments grow and alternate
// halves correctly across many back-to-back and interleaved collectives, and mismatches
// still raise on every rank.

#include <cmath>
#include <cstring>
#include <limits>

#include "comm_gloo/gloo_test_util.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/symmetric_memory.h"
#include "tdist/error.h"

namespace tdist::testing {
namespace {

class GlooShm : public ::testing::TestWithParam<std::tuple<int, bool>> {};

GlooBackendOptions with_shm(bool shm) {
  return GlooBackendOptions().segment_bytes(4096).shared_memory(shm);
}

TEST_P(GlooShm, ReducingAndGatheringCollectivesMatchExpectations) {
  const int world = std::get<0>(GetParam());
  const bool shm = std::get<1>(GetParam());
  run_gloo(
      world,
      [&](GlooBackend& b, int rank, int n) {
        EXPECT_EQ(b.uses_shared_memory(), shm);
        for (int64_t per_rank : {int64_t(5), int64_t(3001)}) {
          const int64_t numel = per_rank * n;
          for (auto dtype : all_dtypes()) {
            for (auto op : all_ops()) {
              if (!op_valid(op, dtype)) continue;
              const auto what = label("all_reduce", n, dtype, op, numel);
              at::Tensor t = rank_input(rank, numel + 1, dtype);
              AllreduceOptions ar;
              ar.op = op;
              b.all_reduce(t, ar)->wait();
              expect_equal(t, expected_reduce(n, numel + 1, dtype, op), what);

              at::Tensor in = rank_input(rank, numel, dtype);
              at::Tensor out = at::empty({per_rank}, in.options());
              ReduceScatterOptions rs;
              rs.op = op;
              b.reduce_scatter_tensor(out, in, rs)->wait();
              expect_equal(
                  out, expected_reduce(n, numel, dtype, op).narrow(0, rank * per_rank, per_rank),
                  label("reduce_scatter_tensor", n, dtype, op, numel));
            }
            at::Tensor cast = rank_input(rank, per_rank, dtype);
            BroadcastOptions bc;
            bc.root = n - 1;
            b.broadcast(cast, bc)->wait();
            expect_equal(cast, rank_input(n - 1, per_rank, dtype), label("broadcast", n, dtype));
            // Even all_to_all_single: block p of rank r's input (values r) lands in rank p's
            // output block r.
            at::Tensor blocks = rank_input(rank, per_rank, dtype).repeat({n});
            at::Tensor swapped = at::empty_like(blocks);
            b.all_to_all_single(swapped, blocks, {}, {}, {})->wait();
            for (int c = 0; c < n; ++c) {
              expect_equal(swapped.narrow(0, c * per_rank, per_rank),
                           rank_input(c, per_rank, dtype), label("all_to_all_single", n, dtype));
            }
            at::Tensor mine = rank_input(rank, per_rank, dtype);
            at::Tensor all = at::zeros({numel}, mine.options());
            b.all_gather_into_tensor(all, mine, {})->wait();
            for (int c = 0; c < n; ++c) {
              expect_equal(all.narrow(0, c * per_rank, per_rank), rank_input(c, per_rank, dtype),
                           label("all_gather_into_tensor", n, dtype));
            }
          }
        }
      },
      with_shm(shm));
}

TEST_P(GlooShm, GrowingSizesBackToBackAndInterleavedWithTcpOps) {
  const int world = std::get<0>(GetParam());
  const bool shm = std::get<1>(GetParam());
  run_gloo(
      world,
      [&](GlooBackend& b, int rank, int n) {
        // 1.2 MB and 2.4 MB outgrow the first 1 MiB halves; small ones reuse bigger ones.
        const std::vector<int64_t> sizes = {3, 300000, 10, 600000, 1, 300001};
        std::vector<at::Tensor> ts;
        std::vector<WorkPtr> works;
        for (size_t i = 0; i < sizes.size(); ++i) {
          ts.push_back(torch::full({sizes[i]}, float(rank + 1 + i)));
          works.push_back(b.all_reduce(ts.back(), {}));
          at::Tensor flag = torch::full({4}, rank == 0 ? float(i) : -1.0f);
          works.push_back(b.broadcast(flag, {}));  // TCP between shared-memory ops
          works.back()->wait();
          EXPECT_TRUE(torch::all(flag == float(i)).item<bool>()) << "broadcast " << i;
        }
        for (auto& w : works) w->wait();
        for (size_t i = 0; i < sizes.size(); ++i) {
          const float want = n * (n + 1) / 2.0f + n * float(i);
          EXPECT_TRUE(torch::all(ts[i] == want).item<bool>())
              << "all_reduce " << i << " of " << sizes[i] << " got " << ts[i][0].item<float>();
        }
        // A non-contiguous float32 all_reduce goes through a working copy.
        at::Tensor strided = torch::full({4, 3}, float(rank + 1)).t();
        b.all_reduce(strided, {})->wait();
        EXPECT_TRUE(torch::all(strided == n * (n + 1) / 2.0f).item<bool>());
        // Non-contiguous and bf16 outputs of all_gather through the staging copies.
        at::Tensor in = torch::full({2, 3}, float(rank)).to(torch::kBFloat16).t();
        at::Tensor out = torch::empty({3 * n, 2}, torch::kBFloat16);
        b.all_gather_into_tensor(out, in.contiguous(), {})->wait();
        for (int c = 0; c < n; ++c) {
          EXPECT_TRUE(torch::all(out.narrow(0, 3 * c, 3) == float(c)).item<bool>()) << c;
        }
      },
      with_shm(shm));
}

TEST_P(GlooShm, SizeMismatchRaisesOnEveryRankWithoutAborting) {
  const int world = std::get<0>(GetParam());
  const bool shm = std::get<1>(GetParam());
  run_gloo(
      world,
      [&](GlooBackend& b, int rank, int) {
        // Every rank passes sizes valid locally; rank 0's input is larger than the others'.
        at::Tensor in = torch::ones({rank == 0 ? 8 : 6});
        at::Tensor all = torch::empty({in.numel() * world});
        try {
          b.all_gather_into_tensor(all, in, {})->wait();
          ADD_FAILURE() << "rank " << rank << ": mismatched all_gather did not raise";
        } catch (const DistBackendError& e) {
          EXPECT_NE(std::string(e.what()).find("all_gather_into_tensor"), std::string::npos)
              << e.what();
        }
        EXPECT_TRUE(b.is_broken());
      },
      with_shm(shm), std::chrono::seconds(10));
}

// A collective too large for the shared memory a rank may use moves over TCP on every rank
// (Note [Falling back to TCP]) instead of raising; smaller ones keep using shared memory.
TEST_P(GlooShm, CollectivesBeyondTheSharedMemoryLimitFallBackToTcp) {
  const int world = std::get<0>(GetParam());
  if (!std::get<1>(GetParam())) GTEST_SKIP() << "shared memory off";
  run_gloo(
      world,
      [&](GlooBackend& b, int rank, int n) {
        EXPECT_TRUE(b.uses_shared_memory());
        const float tri = n * (n + 1) / 2.0f;
        for (int64_t numel : {int64_t(1) << 18, int64_t(3) << 20, int64_t(1) << 10}) {
          const std::string what = std::to_string(numel * 4) + " bytes";
          at::Tensor t = torch::full({numel}, float(rank + 1));
          b.all_reduce(t, {})->wait();
          EXPECT_TRUE(torch::all(t == tri).item<bool>()) << "all_reduce " << what;
          at::Tensor mine = torch::full({numel}, float(rank));
          at::Tensor all = torch::empty({numel * n});
          b.all_gather_into_tensor(all, mine, {})->wait();
          at::Tensor scattered = torch::empty({numel});
          b.reduce_scatter_tensor(scattered, all, {})->wait();
          at::Tensor root = torch::full({numel}, float(rank == 1 ? 7 : 0));
          BroadcastOptions bc;
          bc.root = 1;
          b.broadcast(root, bc)->wait();
          at::Tensor swapped = torch::empty({numel * n});
          b.all_to_all_single(swapped, all, {}, {}, {})->wait();
          for (int c = 0; c < n; ++c) {
            EXPECT_TRUE(torch::all(all.narrow(0, c * numel, numel) == float(c)).item<bool>())
                << "all_gather " << what;
            EXPECT_TRUE(torch::all(swapped.narrow(0, c * numel, numel) == float(rank)).item<bool>())
                << "all_to_all " << what;
          }
          EXPECT_TRUE(torch::all(scattered == float(n * rank)).item<bool>())
              << "reduce_scatter " << what;
          EXPECT_TRUE(torch::all(root == 7.0f).item<bool>()) << "broadcast " << what;
        }
        EXPECT_FALSE(b.is_broken());
      },
      with_shm(true).shared_memory_max_bytes(size_t(4) << 20));  // halves of at most 2 MiB
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooShm,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_shm" : "_tcp");
                         });

// Each rank's only collective grows its segment, then the process exits at once: a fast rank
// must not take the new segment away from a slow peer that has yet to map it.
TDIST_SCENARIO(shm_exit_after_growing_collective) {
  tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo"));
  const int n = tdist::get_world_size();
  at::Tensor t = torch::full({int64_t(3) << 20}, float(tdist::get_rank() + 1));
  tdist::all_reduce(t);
  EXPECT_TRUE(torch::all(t == n * (n + 1) / 2.0f).item<bool>());
  at::Tensor all = torch::empty({n * (int64_t(1) << 20)});
  tdist::all_gather_into_tensor(all, t.narrow(0, 0, int64_t(1) << 20));
  tdist::destroy_process_group();
}

TEST(GlooShmProcesses, ExitRightAfterAGrowingCollective) {
  for (int world : {2, 3, 4}) {
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE("world " + std::to_string(world) + " round " + std::to_string(round));
      ProcessOptions options;
      options.env["TDIST_GLOO_SHM"] = "1";
      options.timeout = std::chrono::seconds(60);
      expect_all_ok(run_ranks_as_processes("shm_exit_after_growing_collective", world, options));
    }
  }
}

TEST(GlooShmOptions, MemoryLimitComesFromTheEnvironmentAndMalformedIsAnError) {
  EXPECT_EQ(gloo_options_from_env().shared_memory_max_bytes(), std::numeric_limits<size_t>::max());
  ::setenv("TDIST_GLOO_SHM_MAX_BYTES", "4194304", 1);
  EXPECT_EQ(gloo_options_from_env().shared_memory_max_bytes(), size_t(4194304));
  ::setenv("TDIST_GLOO_SHM_MAX_BYTES", "lots", 1);
  try {
    gloo_options_from_env();
    ADD_FAILURE() << "a malformed TDIST_GLOO_SHM_MAX_BYTES was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("TDIST_GLOO_SHM_MAX_BYTES must be a number of bytes"),
              std::string::npos)
        << e.what();
  }
  ::unsetenv("TDIST_GLOO_SHM_MAX_BYTES");
}

TEST(GlooShmOptions, EnvironmentTurnsItOff) {
  ::setenv("TDIST_GLOO_SHM", "0", 1);
  EXPECT_FALSE(gloo_options_from_env().shared_memory());
  ::setenv("TDIST_GLOO_SHM", "yes", 1);
  EXPECT_THROW(gloo_options_from_env(), InvalidArgument);
  ::unsetenv("TDIST_GLOO_SHM");
  EXPECT_TRUE(gloo_options_from_env().shared_memory());  // on by default
  ::setenv("TDIST_GLOO_SHM", "1", 1);
  EXPECT_TRUE(gloo_options_from_env().shared_memory());
  ::unsetenv("TDIST_GLOO_SHM");
}

// Note [Same-host collectives] in tdist/detail/comm/engine/same_host.h: every element of a
// shared-memory reduction is folded by one rank in rank order, so every rank's result is
// bitwise ((x0 op x1) op x2) ... : staged, through a working copy (non-contiguous; bfloat16
// accumulating in float32) and on symmetric tensors.
at::Tensor fold_input(int rank, int64_t numel) {
  return at::randn({numel}, at::detail::createCPUGenerator(300 + rank)) *
         std::pow(10.0, rank % 3 * 3);
}

at::Tensor left_fold(int n, int64_t numel) {
  at::Tensor acc = fold_input(0, numel) + fold_input(1, numel);
  for (int p = 2; p < n; ++p) acc = acc + fold_input(p, numel);
  return acc;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.contiguous(), y = b.contiguous();
  return x.scalar_type() == y.scalar_type() && x.numel() == y.numel() &&
         (x.nbytes() == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0);
}

TEST(GlooShmFold, ReductionsAreTheRankOrderLeftFoldBitwise) {
  for (int world : {2, 3, 4}) {
    run_gloo(
        world,
        [&](GlooBackend& b, int rank, int n) {
          ASSERT_TRUE(b.uses_shared_memory());
          for (int64_t numel : {int64_t(7), int64_t(100003)}) {
            const std::string what =
                "world " + std::to_string(n) + ", " + std::to_string(numel) + " elements";
            const at::Tensor expected = left_fold(n, numel);
            at::Tensor plain = fold_input(rank, numel);
            b.all_reduce(plain, {})->wait();
            EXPECT_TRUE(bitwise_equal(plain, expected)) << "all_reduce, " << what;

            at::Tensor strided = at::empty({numel, 2});
            strided.select(1, 0).copy_(fold_input(rank, numel));
            at::Tensor column = strided.select(1, 0);
            b.all_reduce(column, {})->wait();
            EXPECT_TRUE(bitwise_equal(column, expected)) << "non-contiguous all_reduce, " << what;

            at::Tensor bf16 = fold_input(rank, numel).to(at::kBFloat16);
            b.all_reduce(bf16, {})->wait();
            at::Tensor bf16_expected;
            for (int p = 0; p < n; ++p) {
              at::Tensor x = fold_input(p, numel).to(at::kBFloat16).to(at::kFloat);
              bf16_expected = p == 0 ? x : bf16_expected + x;
            }
            EXPECT_TRUE(bitwise_equal(bf16, bf16_expected.to(at::kBFloat16)))
                << "bfloat16 all_reduce, " << what;

            at::Tensor in = fold_input(rank, numel * n);
            at::Tensor out = at::empty({numel});
            b.reduce_scatter_tensor(out, in, {})->wait();
            at::Tensor block_expected = left_fold(n, numel * n).narrow(0, rank * numel, numel);
            EXPECT_TRUE(bitwise_equal(out, block_expected)) << "reduce_scatter_tensor, " << what;

            if (!symmetric_memory::is_available()) continue;
            at::Tensor symm = symmetric_memory::empty({numel}, at::kFloat);
            symm.copy_(fold_input(rank, numel));
            b.all_reduce(symm, {})->wait();
            EXPECT_TRUE(bitwise_equal(symm, expected)) << "symmetric all_reduce, " << what;
          }
        },
        with_shm(true));
  }
}

}  // namespace
}  // namespace tdist::testing

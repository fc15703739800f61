// Symmetric memory (include/tdist/comm/symmetric_memory.h) and the Gloo engine's symmetric
// path (Note [Symmetric path] in src/gloo/shm_collectives.cpp): tensors allocated there give the
// expected results for every dtype and op, as views at different offsets on different ranks,
// interleaved with staged collectives; all_gather reads a symmetric input or output, whichever
// each rank has; a mix of symmetric and plain tensors raises on every rank; freed allocations leave
// nothing in /dev/shm; the placed all-gather (tdist/detail/comm/placed_all_gather.h) on every path.

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>

#include "comm_gloo/gloo_test_util.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/symmetric_memory.h"
#include "tdist/error.h"

namespace tdist::testing {
namespace {

namespace symm = tdist::symmetric_memory;

// A symmetric copy of `t`, at `offset` elements into a larger allocation.
at::Tensor symmetric_copy(const at::Tensor& t, int64_t offset = 0) {
  at::Tensor base = symm::empty({t.numel() + offset}, t.options());
  at::Tensor view = base.narrow(0, offset, t.numel()).view(t.sizes());
  view.copy_(t);
  return view;
}

const char* bytes_of_block(const at::Tensor& dense, int c, int64_t per_rank) {
  return static_cast<const char*>(dense.data_ptr()) + c * per_rank * dense.element_size();
}

int objects_of_this_process() {
  const std::string prefix = "tdist-sym-" + std::to_string(::getpid()) + "-";
  int count = 0;
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return -1;
  while (dirent* e = ::readdir(dir)) {
    if (std::string(e->d_name).rfind(prefix, 0) == 0) ++count;
  }
  ::closedir(dir);
  return count;
}

TEST(SymmetricMemory, EmptyGivesSharedTensorsAndFreesThem) {
  ASSERT_TRUE(symm::is_available());
  const int before = objects_of_this_process();
  {
    at::Tensor t = symm::empty({3, 5}, torch::kDouble);
    EXPECT_EQ(t.sizes(), at::IntArrayRef({3, 5}));
    EXPECT_EQ(t.scalar_type(), at::kDouble);
    EXPECT_TRUE(symm::is_symmetric(t));
    EXPECT_TRUE(symm::is_symmetric(t[2]));
    EXPECT_FALSE(symm::is_symmetric(torch::ones({3, 5})));
    t.fill_(2.5);
    EXPECT_DOUBLE_EQ(t.sum().item<double>(), 37.5);
    EXPECT_EQ(objects_of_this_process(), before + 1);
    at::Tensor zero = symm::empty({0});
    EXPECT_EQ(zero.numel(), 0);
  }
  EXPECT_EQ(objects_of_this_process(), before);
  EXPECT_THROW(symm::empty({4}, torch::TensorOptions().device(torch::kCUDA)), InvalidArgument);
  EXPECT_THROW(symm::empty({-1}), InvalidArgument);
}

class GlooSymmetric : public ::testing::TestWithParam<int> {};

TEST_P(GlooSymmetric, CollectivesOnSymmetricTensorsMatchExpectations) {
  run_gloo(GetParam(), [&](GlooBackend& b, int rank, int n) {
    for (int64_t per_rank : {int64_t(5), int64_t(3001)}) {
      const int64_t numel = per_rank * n;
      for (auto dtype : all_dtypes()) {
        for (auto op : all_ops()) {
          if (!op_valid(op, dtype)) continue;
          // Odd length, at an offset that differs between ranks.
          at::Tensor t = symmetric_copy(rank_input(rank, numel + 1, dtype), rank);
          AllreduceOptions ar;
          ar.op = op;
          b.all_reduce(t, ar)->wait();
          expect_equal(t, expected_reduce(n, numel + 1, dtype, op),
                       label("all_reduce", n, dtype, op, numel + 1));

          at::Tensor in = symmetric_copy(rank_input(rank, numel, dtype), 2 * rank);
          at::Tensor out = at::empty({per_rank}, in.options());
          ReduceScatterOptions rs;
          rs.op = op;
          b.reduce_scatter_tensor(out, in, rs)->wait();
          expect_equal(out,
                       expected_reduce(n, numel, dtype, op).narrow(0, rank * per_rank, per_rank),
                       label("reduce_scatter_tensor", n, dtype, op, numel));
        }
        // all_gather into symmetric memory, from a plain input and in place (the input is
        // this rank's block of the output, as FSDP lays it out).
        at::Tensor all = symmetric_copy(at::zeros({numel}, rank_input(0, 1, dtype).options()));
        b.all_gather_into_tensor(all, rank_input(rank, per_rank, dtype), {})->wait();
        at::Tensor in_place = symmetric_copy(at::zeros_like(all), 1);
        in_place.narrow(0, rank * per_rank, per_rank).copy_(rank_input(rank, per_rank, dtype));
        b.all_gather_into_tensor(in_place, in_place.narrow(0, rank * per_rank, per_rank), {})
            ->wait();
        // From a symmetric input (what peers read then) into a plain output, into a
        // symmetric output, and with ranks choosing differently (every rank has one of the
        // two in symmetric memory, which is all the path needs).
        at::Tensor sym_in = symmetric_copy(rank_input(rank, per_rank, dtype), rank);
        at::Tensor plain_out = at::zeros({numel}, sym_in.options());
        b.all_gather_into_tensor(plain_out, sym_in, {})->wait();
        at::Tensor both_out = symmetric_copy(at::zeros({numel}, sym_in.options()), 3);
        b.all_gather_into_tensor(both_out, sym_in, {})->wait();
        at::Tensor mixed_out = rank % 2 == 0
                                   ? at::zeros({numel}, sym_in.options())
                                   : symmetric_copy(at::zeros({numel}, sym_in.options()), 2);
        at::Tensor mixed_in = rank % 2 == 0 ? sym_in : rank_input(rank, per_rank, dtype);
        b.all_gather_into_tensor(mixed_out, mixed_in, {})->wait();
        for (int c = 0; c < n; ++c) {
          const at::Tensor expected = rank_input(c, per_rank, dtype);
          expect_equal(all.narrow(0, c * per_rank, per_rank), expected,
                       label("all_gather_into_tensor", n, dtype));
          expect_equal(in_place.narrow(0, c * per_rank, per_rank), expected,
                       label("all_gather_into_tensor in place", n, dtype));
          expect_equal(plain_out.narrow(0, c * per_rank, per_rank), expected,
                       label("all_gather_into_tensor symmetric input", n, dtype));
          expect_equal(both_out.narrow(0, c * per_rank, per_rank), expected,
                       label("all_gather_into_tensor symmetric input and output", n, dtype));
          expect_equal(mixed_out.narrow(0, c * per_rank, per_rank), expected,
                       label("all_gather_into_tensor input or output by rank", n, dtype));
        }
      }
    }
  });
}

TEST_P(GlooSymmetric, InterleavedWithStagedCollectivesAndReallocated) {
  run_gloo(GetParam(), [&](GlooBackend& b, int rank, int n) {
    const float tri = n * (n + 1) / 2.0f;
    at::Tensor kept = symm::empty({1000});
    for (int i = 0; i < 12; ++i) {
      // A fresh allocation every other step: peers map the new one and drop freed ones.
      at::Tensor fresh = symm::empty({int64_t(70000) + i});
      fresh.fill_(rank + 1);
      kept.fill_(float(rank + i));
      at::Tensor plain = torch::full({int64_t(3000) * (i + 1)}, float(rank + 1));
      std::vector<WorkPtr> works = {b.all_reduce(fresh, {}), b.all_reduce(plain, {}),
                                    b.all_reduce(kept, {})};
      for (auto& w : works) w->wait();
      EXPECT_TRUE(torch::all(fresh == tri).item<bool>()) << "fresh " << i;
      EXPECT_TRUE(torch::all(plain == tri).item<bool>()) << "plain " << i;
      EXPECT_TRUE(torch::all(kept == tri - n + n * float(i)).item<bool>()) << "kept " << i;
    }
    // The caller may overwrite a symmetric tensor as soon as its collective returns.
    for (int i = 0; i < 20; ++i) {
      kept.fill_(float(rank * i));
      b.all_reduce(kept, {})->wait();
      ASSERT_TRUE(torch::all(kept == float(i) * (n * (n - 1) / 2)).item<bool>()) << i;
    }
  });
}

TEST_P(GlooSymmetric, SymmetricOnSomeRanksOnlyRaisesOnEveryRank) {
  const int world = GetParam();
  if (world == 1) GTEST_SKIP() << "needs peers";
  run_gloo(
      world,
      [&](GlooBackend& b, int rank, int) {
        at::Tensor t = rank == 0 ? symm::empty({64}) : torch::empty({64});
        t.fill_(1);
        try {
          b.all_reduce(t, {})->wait();
          ADD_FAILURE() << "rank " << rank << ": a mixed all_reduce did not raise";
        } catch (const DistBackendError& e) {
          EXPECT_NE(std::string(e.what()).find("symmetric memory"), std::string::npos) << e.what();
        }
      },
      {}, std::chrono::seconds(10));
}

// Note [Placed all-gather]: every rank's block reaches the placer exactly once, on every
// path (symmetric input, staged through the arena, TCP without an arena, a segment smaller
// than the block), and ranks may mix it with all_gather_into_tensor.
TEST_P(GlooSymmetric, PlacedAllGatherHandsEveryBlockOnceOnEveryPath) {
  const int world = GetParam();
  for (bool shm : {true, false}) {
    run_gloo(
        world,
        [&](GlooBackend& b, int rank, int n) {
          for (int64_t per_rank : {int64_t(1), int64_t(777), int64_t(70001)}) {
            for (bool symmetric : {true, false}) {
              if (symmetric && !shm) continue;
              const std::string what = std::string(shm ? "arena" : "tcp") +
                                       (symmetric ? " symmetric" : " plain") + " per_rank " +
                                       std::to_string(per_rank);
              at::Tensor plain = rank_input(rank, per_rank, at::kFloat);
              at::Tensor in = symmetric ? symmetric_copy(plain, rank) : plain;
              // Rank c's block lands at block n-1-c: an order no dense output has.
              at::Tensor placed = at::full({per_rank * n}, -1.0f);
              std::vector<int> calls(n, 0);
              const size_t bytes = in.nbytes();
              auto place = [&](int c, const char* block) {
                ++calls[c];
                std::memcpy(static_cast<char*>(placed.data_ptr()) + (n - 1 - c) * bytes, block,
                            bytes);
              };
              ASSERT_TRUE(b.supports_all_gather_placed());
              if (rank % 2 == 1) {
                // A peer may run the ordinary collective against it.
                at::Tensor dense = at::empty({per_rank * n});
                b.all_gather_into_tensor(dense, in, {})->wait();
                for (int c = 0; c < n; ++c) place(c, bytes_of_block(dense, c, per_rank));
              } else {
                b.all_gather_placed(in, place, {})->wait();
              }
              for (int c = 0; c < n; ++c) {
                EXPECT_EQ(calls[c], 1) << what << " block " << c;
                expect_equal(placed.narrow(0, (n - 1 - c) * per_rank, per_rank),
                             rank_input(c, per_rank, at::kFloat), what);
              }
            }
          }
        },
        GlooBackendOptions().segment_bytes(4096).shared_memory(shm));
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooSymmetric, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// Ranks as processes: all_reduce on symmetric tensors through the public API, then every
// allocation freed leaves no object of this process behind.
TDIST_SCENARIO(symmetric_all_reduce_processes) {
  tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo"));
  const int n = tdist::get_world_size();
  const int rank = tdist::get_rank();
  {
    for (int64_t numel : {int64_t(1), int64_t(4097), int64_t(1) << 20}) {
      at::Tensor t = symm::empty({numel});
      t.fill_(float(rank + 1));
      tdist::all_reduce(t);
      EXPECT_TRUE(torch::all(t == n * (n + 1) / 2.0f).item<bool>()) << numel;
      at::Tensor out = symm::empty({numel * n});
      tdist::all_gather_into_tensor(out, t);
      EXPECT_TRUE(torch::all(out == n * (n + 1) / 2.0f).item<bool>()) << numel;
    }
  }
  tdist::barrier();
  EXPECT_EQ(objects_of_this_process(), 0);
  tdist::destroy_process_group();
}

TEST(GlooSymmetricProcesses, AllReduceThroughThePublicApi) {
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    ProcessOptions options;
    options.timeout = std::chrono::seconds(60);
    expect_all_ok(run_ranks_as_processes("symmetric_all_reduce_processes", world, options));
  }
}

// Note [Names at exit]: an allocation a program never frees (a leaked owner, an early exit)
// leaves no name in /dev/shm once the process has exited.
TDIST_SCENARIO(symmetric_leak_then_exit) {
  auto* leaked = new at::Tensor(symm::empty({4096}));
  leaked->fill_(1);
  std::cout << "pid=" << ::getpid() << " objects=" << objects_of_this_process() << std::endl;
  std::exit(0);
}

TEST(SymmetricMemory, NamesOfLeakedAllocationsGoAtExit) {
  ProcessOptions options;
  options.timeout = std::chrono::seconds(30);
  auto results = run_ranks_as_processes("symmetric_leak_then_exit", 1, options);
  expect_all_ok(results);
  const std::string& out = results.at(0).output;
  const size_t at = out.find("pid=");
  ASSERT_NE(at, std::string::npos) << out;
  const long pid = std::strtol(out.c_str() + at + 4, nullptr, 10);
  EXPECT_NE(out.find("objects=1"), std::string::npos) << out;  // it existed while running
  const std::string prefix = "tdist-sym-" + std::to_string(pid) + "-";
  DIR* dir = ::opendir("/dev/shm");
  ASSERT_NE(dir, nullptr);
  while (dirent* e = ::readdir(dir)) {
    EXPECT_NE(std::string(e->d_name).rfind(prefix, 0), 0u) << "left behind: " << e->d_name;
  }
  ::closedir(dir);
}

}  // namespace
}  // namespace tdist::testing

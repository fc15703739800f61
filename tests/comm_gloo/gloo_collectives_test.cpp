// Every collective x dtype x op at world sizes 1-4 against expectations computed
// independently (tests/comm_gloo/gloo_test_util.h). Ranks are threads, each with its own
// GlooBackend over TCP loopback.

#include "comm_gloo/gloo_test_util.h"

namespace tdist::testing {
namespace {

class GlooWorld : public ::testing::TestWithParam<int> {};

// Small and ring-sized (> 64 KiB in most dtypes) tensors; a 4 KiB segment size makes the
// ring pipeline run many segments per chunk.
GlooBackendOptions small_segments() {
  return GlooBackendOptions().segment_bytes(4096);
}

TEST_P(GlooWorld, AllReduceEveryDtypeAndOp) {
  const int world = GetParam();
  run_gloo(
      world,
      [&](GlooBackend& b, int rank, int n) {
        for (int64_t numel : {int64_t(7), int64_t(20000)}) {
          for (auto dtype : all_dtypes()) {
            for (auto op : all_ops()) {
              if (!op_valid(op, dtype)) continue;
              at::Tensor t = rank_input(rank, numel, dtype);
              AllreduceOptions opts;
              opts.op = op;
              b.all_reduce(t, opts)->wait();
              expect_equal(t, expected_reduce(n, numel, dtype, op),
                           label("all_reduce", n, dtype, op, numel));
            }
          }
        }
      },
      small_segments());
}

TEST_P(GlooWorld, ReduceScatterTensorAndListEveryDtypeAndOp) {
  const int world = GetParam();
  run_gloo(
      world,
      [&](GlooBackend& b, int rank, int n) {
        for (int64_t per_rank : {int64_t(7), int64_t(3000)}) {
          for (auto dtype : all_dtypes()) {
            for (auto op : all_ops()) {
              if (!op_valid(op, dtype)) continue;
              const int64_t numel = per_rank * n;
              at::Tensor in = rank_input(rank, numel, dtype);
              at::Tensor want =
                  expected_reduce(n, numel, dtype, op).narrow(0, rank * per_rank, per_rank);
              at::Tensor out = at::empty({per_rank}, in.options());
              ReduceScatterOptions opts;
              opts.op = op;
              b.reduce_scatter_tensor(out, in, opts)->wait();
              expect_equal(out, want, label("reduce_scatter_tensor", n, dtype, op, numel));
              at::Tensor in_copy = rank_input(rank, numel, dtype);
              EXPECT_TRUE(torch::equal(in, in_copy)) << "input must stay untouched";

              std::vector<at::Tensor> ins;
              for (int c = 0; c < n; ++c)
                ins.push_back(in.narrow(0, c * per_rank, per_rank).clone());
              at::Tensor out2 = at::zeros({per_rank}, in.options());
              b.reduce_scatter(out2, ins, opts)->wait();
              expect_equal(out2, want, label("reduce_scatter", n, dtype, op, numel));
            }
          }
        }
      },
      small_segments());
}

TEST_P(GlooWorld, ReduceToEveryRoot) {
  const int world = GetParam();
  run_gloo(world, [&](GlooBackend& b, int rank, int n) {
    for (int root = 0; root < n; ++root) {
      for (auto dtype : all_dtypes()) {
        for (auto op : {ReduceOp::SUM, ReduceOp::MAX, ReduceOp::AVG, ReduceOp::BXOR}) {
          if (!op_valid(op, dtype)) continue;
          at::Tensor t = rank_input(rank, 11, dtype);
          ReduceOptions opts;
          opts.op = op;
          opts.root = root;
          b.reduce(t, opts)->wait();
          at::Tensor want =
              rank == root ? expected_reduce(n, 11, dtype, op) : rank_input(rank, 11, dtype);
          expect_equal(t, want, label("reduce root=" + std::to_string(root), n, dtype, op, 11));
        }
      }
    }
  });
}

TEST_P(GlooWorld, AllReduceCoalesced) {
  const int world = GetParam();
  run_gloo(world, [&](GlooBackend& b, int rank, int n) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kInt}) {
      std::vector<at::Tensor> ts = {rank_input(rank, 5, dtype, 0).view({5}),
                                    rank_input(rank, 12, dtype, 1).view({3, 4}),
                                    rank_input(rank, 1, dtype, 2)};
      AllreduceOptions opts;
      opts.op = ReduceOp::SUM;
      b.all_reduce_coalesced(ts, opts)->wait();
      expect_equal(ts[0], expected_reduce(n, 5, dtype, ReduceOp::SUM, 0), "coalesced[0]");
      expect_equal(ts[1], expected_reduce(n, 12, dtype, ReduceOp::SUM, 1), "coalesced[1]");
      EXPECT_EQ(ts[1].sizes(), (std::vector<int64_t>{3, 4}));
      expect_equal(ts[2], expected_reduce(n, 1, dtype, ReduceOp::SUM, 2), "coalesced[2]");
    }
  });
}

TEST_P(GlooWorld, BroadcastFromEveryRootEveryDtype) {
  const int world = GetParam();
  run_gloo(
      world,
      [&](GlooBackend& b, int rank, int n) {
        for (int root = 0; root < n; ++root) {
          for (auto dtype : all_dtypes()) {
            for (int64_t numel : {int64_t(7), int64_t(5000)}) {
              at::Tensor t = rank_input(rank, numel, dtype);
              BroadcastOptions opts;
              opts.root = root;
              b.broadcast(t, opts)->wait();
              expect_equal(t, rank_input(root, numel, dtype),
                           label("broadcast", n, dtype, ReduceOp::SUM, numel));
            }
          }
        }
      },
      small_segments());
}

TEST_P(GlooWorld, AllGatherIntoTensorAndListEveryDtype) {
  const int world = GetParam();
  run_gloo(
      world,
      [&](GlooBackend& b, int rank, int n) {
        for (auto dtype : all_dtypes()) {
          for (int64_t numel : {int64_t(7), int64_t(3000)}) {
            at::Tensor in = rank_input(rank, numel, dtype);
            std::vector<at::Tensor> parts;
            for (int r = 0; r < n; ++r) parts.push_back(rank_input(r, numel, dtype));
            at::Tensor want = torch::cat(parts);

            at::Tensor out = at::empty({numel * n}, in.options());
            b.all_gather_into_tensor(out, in, {})->wait();
            expect_equal(out, want,
                         label("all_gather_into_tensor", n, dtype, ReduceOp::SUM, numel));

            // In place: the input is this rank's slice of the output.
            at::Tensor out2 = at::zeros({numel * n}, in.options());
            at::Tensor slice = out2.narrow(0, rank * numel, numel);
            slice.copy_(in);
            b.all_gather_into_tensor(out2, slice, {})->wait();
            expect_equal(out2, want, "all_gather_into_tensor in place");

            std::vector<at::Tensor> outs;
            for (int r = 0; r < n; ++r) outs.push_back(at::zeros({numel}, in.options()));
            b.all_gather(outs, in, {})->wait();
            for (int r = 0; r < n; ++r)
              expect_equal(outs[r], parts[r], "all_gather[" + std::to_string(r) + "]");
          }
        }
      },
      small_segments());
}

TEST_P(GlooWorld, GatherAndScatterToEveryRoot) {
  const int world = GetParam();
  run_gloo(world, [&](GlooBackend& b, int rank, int n) {
    for (int root = 0; root < n; ++root) {
      for (auto dtype : all_dtypes()) {
        at::Tensor in = rank_input(rank, 9, dtype);
        std::vector<at::Tensor> outs;
        if (rank == root) {
          for (int r = 0; r < n; ++r) outs.push_back(at::zeros({9}, in.options()));
        }
        GatherOptions gopts;
        gopts.root = root;
        b.gather(outs, in, gopts)->wait();
        for (size_t r = 0; r < outs.size(); ++r)
          expect_equal(outs[r], rank_input(r, 9, dtype), "gather");

        std::vector<at::Tensor> ins;
        if (rank == root) {
          for (int r = 0; r < n; ++r) ins.push_back(rank_input(r, 9, dtype, 3));
        }
        at::Tensor out = at::zeros({9}, in.options());
        ScatterOptions sopts;
        sopts.root = root;
        b.scatter(out, ins, sopts)->wait();
        expect_equal(out, rank_input(rank, 9, dtype, 3), "scatter");
      }
    }
  });
}

TEST_P(GlooWorld, AllToAllSingleEvenAndUnevenSplits) {
  const int world = GetParam();
  run_gloo(world, [&](GlooBackend& b, int rank, int n) {
    for (auto dtype : all_dtypes()) {
      // Even: rows of 3 elements, 2 rows per peer. Row (r, p, k) value encodes sender.
      at::Tensor in = (torch::arange(2 * n * 3, torch::kLong) + 100 * rank).view({2 * n, 3});
      at::Tensor out = at::zeros({2 * n, 3}, torch::kLong).to(dtype);
      b.all_to_all_single(out, in.to(dtype), {}, {}, {})->wait();
      for (int p = 0; p < n; ++p) {
        at::Tensor want = (torch::arange(2 * n * 3, torch::kLong) + 100 * p)
                              .view({2 * n, 3})
                              .narrow(0, 2 * rank, 2);
        expect_equal(out.narrow(0, 2 * p, 2), want.to(dtype), "all_to_all_single even");
      }
      // Uneven: rank r sends (r + p + 1) rows to p.
      std::vector<int64_t> in_splits(n), out_splits(n);
      for (int p = 0; p < n; ++p) {
        in_splits[p] = rank + p + 1;
        out_splits[p] = p + rank + 1;
      }
      int64_t in_rows = 0, out_rows = 0;
      for (int p = 0; p < n; ++p) {
        in_rows += in_splits[p];
        out_rows += out_splits[p];
      }
      at::Tensor uin =
          (torch::arange(in_rows * 2, torch::kLong) % 50 + rank).view({in_rows, 2}).to(dtype);
      at::Tensor uout = at::zeros({out_rows, 2}, uin.options());
      b.all_to_all_single(uout, uin, out_splits, in_splits, {})->wait();
      int64_t offset = 0;
      for (int p = 0; p < n; ++p) {
        // p's rows for us start after its rows for ranks < rank.
        int64_t start = 0;
        for (int q = 0; q < rank; ++q) start += p + q + 1;
        at::Tensor pin = (torch::arange((int64_t)0,
                                        (int64_t)(2 *
                                                  [&] {
                                                    int64_t rows = 0;
                                                    for (int q = 0; q < n; ++q) rows += p + q + 1;
                                                    return rows;
                                                  }()),
                                        torch::kLong) %
                              50 +
                          p)
                             .view({-1, 2});
        expect_equal(uout.narrow(0, offset, out_splits[p]),
                     pin.narrow(0, start, out_splits[p]).to(dtype),
                     "all_to_all_single uneven from " + std::to_string(p));
        offset += out_splits[p];
      }
    }
  });
}

TEST_P(GlooWorld, AllToAllList) {
  const int world = GetParam();
  run_gloo(world, [&](GlooBackend& b, int rank, int n) {
    std::vector<at::Tensor> ins, outs;
    for (int p = 0; p < n; ++p) {
      ins.push_back(torch::full({rank + p + 1}, 10 * rank + p, torch::kInt));
      outs.push_back(torch::zeros({p + rank + 1}, torch::kInt));
    }
    b.all_to_all(outs, ins, {})->wait();
    for (int p = 0; p < n; ++p)
      expect_equal(outs[p], torch::full({p + rank + 1}, 10 * p + rank, torch::kInt), "all_to_all");
  });
}

TEST_P(GlooWorld, BarrierAndAsyncOpsRunInIssueOrder) {
  const int world = GetParam();
  run_gloo(world, [&](GlooBackend& b, int rank, int n) {
    b.barrier({})->wait();
    std::vector<at::Tensor> ts;
    std::vector<WorkPtr> works;
    for (int i = 0; i < 20; ++i) {
      ts.push_back(rank_input(rank, 100 + i, at::kFloat, i));
      AllreduceOptions opts;
      works.push_back(b.all_reduce(ts.back(), opts));
    }
    works.push_back(b.barrier({}));
    for (auto& w : works) EXPECT_TRUE(w->wait(std::chrono::seconds(20)));
    for (int i = 0; i < 20; ++i) {
      EXPECT_TRUE(works[i]->is_completed());
      EXPECT_TRUE(works[i]->is_success());
      expect_equal(ts[i], expected_reduce(n, 100 + i, at::kFloat, ReduceOp::SUM, i), "async");
    }
  });
}

TEST_P(GlooWorld, NonContiguousTensorsAreHandled) {
  const int world = GetParam();
  run_gloo(world, [&](GlooBackend& b, int rank, int n) {
    at::Tensor base = rank_input(rank, 12, at::kDouble).view({3, 4});
    at::Tensor t = base.t();  // non-contiguous view
    ASSERT_FALSE(t.is_contiguous());
    b.all_reduce(t, {})->wait();
    expect_equal(base.reshape({-1}), expected_reduce(n, 12, at::kDouble, ReduceOp::SUM),
                 "non-contiguous all_reduce");

    at::Tensor big = torch::zeros({4, 2 * n}, torch::kFloat);
    at::Tensor out = big.slice(1, 0, 2 * n, 2);  // strided output, 4 x n
    at::Tensor in = torch::full({4}, float(rank + 1));
    b.all_gather_into_tensor(out, in, {})->wait();
    // out is viewed as n chunks of 4 elements in row-major order of its shape.
    at::Tensor flat = out.contiguous().reshape({-1});
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(torch::all(flat.narrow(0, 4 * r, 4) == float(r + 1)).item<bool>());
  });
}

TEST_P(GlooWorld, SendRecvWithTagsAndAsyncPairs) {
  const int world = GetParam();
  if (world == 1) GTEST_SKIP() << "needs a peer";
  run_gloo(world, [&](GlooBackend& b, int rank, int n) {
    const int right = (rank + 1) % n, left = (rank - 1 + n) % n;
    // Everyone sends first then receives: only works when sends do not block recvs.
    SendRecvOptions t1, t2;
    t1.tag_id = 1;
    t2.tag_id = 2;
    at::Tensor a = torch::full({5}, rank * 10 + 1, torch::kLong);
    at::Tensor c = torch::full({3}, rank * 10 + 2, torch::kBFloat16);
    auto s2 = b.send(c, right, t2);  // tag 2 first: recv by tag, not by order
    auto s1 = b.send(a, right, t1);
    at::Tensor ra = torch::zeros({5}, torch::kLong), rc = torch::zeros({3}, torch::kBFloat16);
    auto r1 = b.recv(ra, left, t1);
    auto r2 = b.recv(rc, left, t2);
    for (auto& w : {s1, s2, r1, r2}) w->wait();
    expect_equal(ra, torch::full({5}, left * 10 + 1, torch::kLong), "recv tag 1");
    expect_equal(rc, torch::full({3}, left * 10 + 2, torch::kBFloat16), "recv tag 2");
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooWorld, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(GlooPrecision, HalfTypesAccumulateInFloat32) {
  // bf16 spacing at 256 is 2: summing 256 + 1 + 1 + 1 one bf16 step at a time gives 256,
  // a float32 accumulation gives 259, which rounds to 260.
  run_gloo(4, [&](GlooBackend& b, int rank, int) {
    for (auto dtype : {at::kBFloat16, at::kHalf}) {
      const double big = dtype == at::kBFloat16 ? 256 : 2048;  // fp16 spacing at 2048 is 2
      at::Tensor t = torch::full({100000}, rank == 0 ? big : 1.0, torch::kDouble).to(dtype);
      b.all_reduce(t, {})->wait();
      at::Tensor want = torch::full({100000}, big + 3, torch::kDouble).to(dtype);
      EXPECT_TRUE(torch::equal(t, want)) << c10::toString(dtype) << " got " << t[0].item<double>();
    }
  });
}

TEST(GlooOptions, LazyInitConnectsOnFirstCollective) {
  run_gloo(
      3,
      [&](GlooBackend& b, int rank, int n) {
        EXPECT_TRUE(b.options().lazy_init());
        at::Tensor t = rank_input(rank, 10, at::kInt);
        b.all_reduce(t, {})->wait();
        expect_equal(t, expected_reduce(n, 10, at::kInt, ReduceOp::SUM), "lazy all_reduce");
      },
      GlooBackendOptions().lazy_init(true).channels(1));
}

TEST(GlooOptions, EnvironmentIsParsed) {
  ::setenv("GLOO_SOCKET_IFNAME", "lo,lo", 1);
  ::setenv("TORCH_GLOO_LAZY_INIT", "1", 1);
  auto options = gloo_options_from_env();
  ::unsetenv("GLOO_SOCKET_IFNAME");
  ::unsetenv("TORCH_GLOO_LAZY_INIT");
  EXPECT_EQ(options.interfaces(), (std::vector<std::string>{"lo", "lo"}));
  EXPECT_TRUE(options.lazy_init());
  // Two channels, one per listed interface (both loopback here).
  run_gloo(
      2,
      [&](GlooBackend& b, int rank, int n) {
        at::Tensor t = rank_input(rank, 10000, at::kFloat);
        b.all_reduce(t, {})->wait();
        expect_equal(t, expected_reduce(n, 10000, at::kFloat, ReduceOp::SUM), "ifname all_reduce");
      },
      options.segment_bytes(4096));
}

}  // namespace
}  // namespace tdist::testing

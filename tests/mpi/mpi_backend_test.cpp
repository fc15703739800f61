// The collective suite on the MPI backend. Runs under mpirun at world sizes 1-4: every rank
// runs the same tests in the same order (SPMD) and checks results against values computed
// locally from every rank's inputs.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "mpi/mpi_world.h"
#include "mpi/reduce_locally.h"
#include "tdist/comm/backend.h"
#include "tdist/error.h"
#include "tdist/mpi/mpi_backend.h"

namespace {

using tdist::ReduceOp;
using tdist::mpi::MPIBackend;

using tdist::mpi::testing::pg;
using tdist::mpi::testing::rank;
using tdist::mpi::testing::reduce_locally;
using tdist::mpi::testing::world;

const std::vector<at::ScalarType> kAllDtypes = {at::kFloat,    at::kDouble, at::kHalf,
                                                at::kBFloat16, at::kByte,   at::kChar,
                                                at::kInt,      at::kLong,   at::kBool};

// Rank r's input: small integers, exact in every dtype; in {1,2} for PRODUCT so that
// products of four ranks fit int8.
at::Tensor input_of(int r, int64_t n, at::ScalarType dtype, ReduceOp op) {
  auto i = torch::arange(n, torch::kDouble);
  at::Tensor v;
  if (dtype == at::kBool) {
    v = torch::remainder(i + r, 2);
  } else if (op == ReduceOp::PRODUCT) {
    v = torch::remainder(i + 3 * r, 2) + 1;
  } else {
    v = torch::remainder(i + 3 * r, 7);
  }
  return v.to(dtype);
}

std::vector<ReduceOp> ops_for(at::ScalarType dtype) {
  if (at::isFloatingType(dtype)) {
    return {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX};
  }
  return {ReduceOp::SUM,  ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX,
          ReduceOp::BAND, ReduceOp::BOR,     ReduceOp::BXOR};
}

std::string describe(at::ScalarType dtype, ReduceOp op) {
  return std::string(c10::toString(dtype)) + "/" + tdist::to_string(op);
}

TEST(MPIBackend, RegisteredThroughThePublicRegistry) {
  EXPECT_TRUE(tdist::detail::backend_registered("mpi"));
  EXPECT_EQ(tdist::Backend("MPI").str(), "mpi");
}

TEST(MPIBackend, AllReduceEveryDtypeAndOp) {
  const int64_t n = 7;  // not a multiple of any world size > 1
  for (auto dtype : kAllDtypes) {
    for (auto op : ops_for(dtype)) {
      auto t = input_of(rank(), n, dtype, op);
      tdist::AllreduceOptions opts;
      opts.op = op;
      pg().all_reduce(t, opts)->wait();
      std::vector<at::Tensor> all;
      for (int r = 0; r < world(); ++r) all.push_back(input_of(r, n, dtype, op));
      auto expected = reduce_locally(all, op);
      EXPECT_TRUE(t.equal(expected))
          << describe(dtype, op) << "\n got " << t << "\n want " << expected;
    }
  }
}

TEST(MPIBackend, AllReduceAccumulatesHalfPrecisionInFp32) {
  // 1 + many tiny values: fp16 accumulation in order would lose them; fp32 does not.
  auto t = torch::full({4}, rank() == 0 ? 1.0 : 1e-3, torch::kBFloat16);
  pg().all_reduce(t, {})->wait();
  double expected = 1.0 + 1e-3 * (world() - 1);
  auto want = torch::full({4}, expected, torch::kDouble).to(torch::kBFloat16);
  EXPECT_TRUE(t.equal(want)) << t;
}

TEST(MPIBackend, BroadcastFromEveryRoot) {
  for (auto dtype : kAllDtypes) {
    for (int root = 0; root < world(); ++root) {
      auto t = input_of(rank(), 5, dtype, ReduceOp::SUM);
      tdist::BroadcastOptions opts;
      opts.root = root;
      pg().broadcast(t, opts)->wait();
      EXPECT_TRUE(t.equal(input_of(root, 5, dtype, ReduceOp::SUM))) << c10::toString(dtype);
    }
  }
}

TEST(MPIBackend, ReduceToEveryRoot) {
  for (int root = 0; root < world(); ++root) {
    auto t = input_of(rank(), 9, at::kFloat, ReduceOp::MAX);
    auto before = t.clone();
    tdist::ReduceOptions opts;
    opts.root = root;
    opts.op = ReduceOp::MAX;
    pg().reduce(t, opts)->wait();
    std::vector<at::Tensor> all;
    for (int r = 0; r < world(); ++r) all.push_back(input_of(r, 9, at::kFloat, ReduceOp::MAX));
    if (rank() == root) {
      EXPECT_TRUE(t.equal(reduce_locally(all, ReduceOp::MAX)));
    }
  }
}

TEST(MPIBackend, AllGatherIntoTensorAndList) {
  for (auto dtype : kAllDtypes) {
    auto in = input_of(rank(), 7, dtype, ReduceOp::SUM).reshape({7, 1});
    auto out = torch::empty({7 * world(), 1}, in.options());
    pg().all_gather_into_tensor(out, in, {})->wait();
    std::vector<at::Tensor> list;
    for (int r = 0; r < world(); ++r) list.push_back(torch::empty_like(in));
    pg().all_gather(list, in, {})->wait();
    for (int r = 0; r < world(); ++r) {
      auto want = input_of(r, 7, dtype, ReduceOp::SUM).reshape({7, 1});
      EXPECT_TRUE(out.narrow(0, 7 * r, 7).equal(want)) << c10::toString(dtype);
      EXPECT_TRUE(list[r].equal(want)) << c10::toString(dtype);
    }
  }
}

TEST(MPIBackend, GatherAndScatter) {
  for (int root = 0; root < world(); ++root) {
    auto in = torch::full({3}, rank() * 10 + root, torch::kLong);
    std::vector<at::Tensor> gathered;
    if (rank() == root) {
      for (int r = 0; r < world(); ++r) gathered.push_back(torch::empty({3}, torch::kLong));
    }
    tdist::GatherOptions g;
    g.root = root;
    pg().gather(gathered, in, g)->wait();
    if (rank() == root) {
      for (int r = 0; r < world(); ++r) EXPECT_EQ(gathered[r][0].item<int64_t>(), r * 10 + root);
    }
    std::vector<at::Tensor> pieces;
    if (rank() == root) {
      for (int r = 0; r < world(); ++r) pieces.push_back(torch::full({2, 2}, r + 100.0 * root));
    }
    auto out = torch::zeros({2, 2});
    tdist::ScatterOptions s;
    s.root = root;
    pg().scatter(out, pieces, s)->wait();
    EXPECT_TRUE(out.equal(torch::full({2, 2}, rank() + 100.0 * root)));
  }
}

TEST(MPIBackend, ReduceScatterTensorEveryDtype) {
  for (auto dtype : kAllDtypes) {
    for (auto op : {ReduceOp::SUM, ReduceOp::MAX}) {
      const int64_t chunk = 5;
      auto in = input_of(rank(), chunk * world(), dtype, op);
      auto out = torch::empty({chunk}, in.options());
      tdist::ReduceScatterOptions opts;
      opts.op = op;
      pg().reduce_scatter_tensor(out, in, opts)->wait();
      std::vector<at::Tensor> all;
      for (int r = 0; r < world(); ++r) all.push_back(input_of(r, chunk * world(), dtype, op));
      auto full = reduce_locally(all, op);
      EXPECT_TRUE(out.equal(full.narrow(0, chunk * rank(), chunk))) << describe(dtype, op);
    }
  }
  // The list form.
  std::vector<at::Tensor> inputs;
  for (int r = 0; r < world(); ++r) inputs.push_back(torch::full({2}, rank() + r, torch::kDouble));
  auto out = torch::empty({2}, torch::kDouble);
  tdist::ReduceScatterOptions avg;
  avg.op = ReduceOp::AVG;
  pg().reduce_scatter(out, inputs, avg)->wait();
  double expected = 0;
  for (int r = 0; r < world(); ++r) expected += r + rank();
  EXPECT_DOUBLE_EQ(out[0].item<double>(), expected / world());
}

TEST(MPIBackend, AllToAllSingleEqualAndUnevenSplits) {
  // Equal splits: rank r sends value 100*r + dst to dst.
  auto in = torch::empty({world() * 2}, torch::kInt);
  for (int d = 0; d < world(); ++d) in.narrow(0, 2 * d, 2).fill_(100 * rank() + d);
  auto out = torch::empty_like(in);
  pg().all_to_all_single(out, in, {}, {}, {})->wait();
  for (int s = 0; s < world(); ++s) {
    EXPECT_EQ(out[2 * s].item<int>(), 100 * s + rank());
  }
  // Uneven: rank r sends (d + 1) rows of width 3 to rank d, filled with r.
  std::vector<int64_t> in_splits, out_splits;
  int64_t in_rows = 0, out_rows = 0;
  for (int d = 0; d < world(); ++d) {
    in_splits.push_back(d + 1);
    in_rows += d + 1;
    out_splits.push_back(rank() + 1);
    out_rows += rank() + 1;
  }
  auto uin = torch::full({in_rows, 3}, static_cast<float>(rank()));
  auto uout = torch::full({out_rows, 3}, -1.0f);
  pg().all_to_all_single(uout, uin, out_splits, in_splits, {})->wait();
  int64_t row = 0;
  for (int s = 0; s < world(); ++s) {
    for (int k = 0; k <= rank(); ++k, ++row) EXPECT_EQ(uout[row][0].item<float>(), s);
  }
  // The list form.
  std::vector<at::Tensor> ins, outs;
  for (int d = 0; d < world(); ++d) {
    ins.push_back(torch::full({d + 1}, rank() * 1.0));
    outs.push_back(torch::empty({rank() + 1}));
  }
  pg().all_to_all(outs, ins, {})->wait();
  for (int s = 0; s < world(); ++s) EXPECT_EQ(outs[s][0].item<float>(), s);
}

TEST(MPIBackend, SendRecvRingWithTagsAndLargeMessagesDoNotDeadlock) {
  if (world() == 1) GTEST_SKIP() << "needs a peer";
  const int next = (rank() + 1) % world(), prev = (rank() + world() - 1) % world();
  // 4 MiB both ways at once: blocking sends on one thread would deadlock here.
  auto out = torch::full({1 << 20}, static_cast<float>(rank()));
  auto in = torch::empty({1 << 20});
  tdist::SendRecvOptions tag7;
  tag7.tag_id = 7;
  auto s = pg().send(out, next, tag7);
  auto r = pg().recv(in, prev, tag7);
  s->wait();
  r->wait();
  EXPECT_EQ(in[12345].item<float>(), prev);
}

TEST(MPIBackend, ManyOpsInFlightCompleteInOrder) {
  std::vector<at::Tensor> tensors;
  std::vector<tdist::WorkPtr> works;
  for (int k = 0; k < 8; ++k) {
    tensors.push_back(torch::full({1000}, static_cast<float>(k + rank())));
    works.push_back(pg().all_reduce(tensors.back(), {}));
  }
  for (int k = 0; k < 8; ++k) {
    works[k]->wait();
    double expected = 0;
    for (int r = 0; r < world(); ++r) expected += k + r;
    EXPECT_EQ(tensors[k][999].item<float>(), expected);
  }
  pg().barrier({})->wait();
}

TEST(MPIBackend, NonContiguousTensorsAreHandled) {
  auto base = torch::arange(12, torch::kFloat).reshape({3, 4});
  auto column_major = base.t();  // non-contiguous view
  pg().all_reduce(column_major, {})->wait();
  EXPECT_TRUE(base.equal(torch::arange(12, torch::kFloat).reshape({3, 4}) * world()));
}

TEST(MPIBackend, BadArgumentsAreClearErrors) {
  auto f = torch::ones({4});
  tdist::AllreduceOptions band;
  band.op = ReduceOp::BAND;
  EXPECT_THROW(pg().all_reduce(f, band), tdist::InvalidArgument);
  auto wrong = torch::empty({3});
  EXPECT_THROW(pg().all_gather_into_tensor(wrong, f, {}), tdist::InvalidArgument);
  tdist::BroadcastOptions bad_root;
  bad_root.root = world();
  try {
    pg().broadcast(f, bad_root);
    FAIL() << "expected InvalidArgument";
  } catch (const tdist::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("root"), std::string::npos) << e.what();
  }
  auto ints = torch::ones({4}, torch::kInt);
  tdist::AllreduceOptions avg;
  avg.op = ReduceOp::AVG;
  EXPECT_THROW(pg().all_reduce(ints, avg), tdist::InvalidArgument);
}

}  // namespace

// The MPI backend's shared-memory collectives (Note [Shared-memory collectives] in
// src/mpi/shm_collectives.h): all_reduce, reduce_scatter_tensor and all_gather_into_tensor
// when every rank is on this node. Runs under mpirun at world sizes 1-4, with the default
// piece size and with TDIST_MPI_SHM_PIECE_BYTES=4096 (many pieces per op, both halves reused
// many times). Every expectation is computed locally from every rank's inputs.
#include <gtest/gtest.h>

#include <sys/uio.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>

#include <torch/torch.h>

#include "mpi/mpi_world.h"
#include "mpi/reduce_locally.h"
#include "mpi/shm_collectives.h"
#include "tdist/comm/symmetric_memory.h"
#include "tdist/detail/comm/engine/peer_memory.h"
#include "tdist/error.h"
#include "tdist/mpi/mpi_backend.h"

namespace {

using tdist::ReduceOp;
using tdist::mpi::MPIBackend;

using tdist::mpi::testing::pg;
using tdist::mpi::testing::rank;
using tdist::mpi::testing::world;

// TDIST_MPI_SHM=0 (the test_mpi_shm_off variant): the same ops on MPI messages.
bool shm_off() {
  const char* v = std::getenv("TDIST_MPI_SHM");
  return v && std::string(v) == "0";
}

// Whether this machine lets the ranks read each other's memory (process_vm_readv), found
// independently of the backend: every rank reads a word from every peer.
bool kernel_allows_cross_process_reads() {
  static const uint64_t word = 0x5eed'0000'0000'0000ull;
  auto mine = torch::tensor(
      {static_cast<int64_t>(getpid()), static_cast<int64_t>(reinterpret_cast<uintptr_t>(&word))});
  auto all = torch::empty({2 * world()}, torch::kLong);
  pg().all_gather_into_tensor(all, mine, {})->wait();  // (MPI is the executor thread's)
  int64_t ok = 1;
  for (int r = 0; r < world(); ++r) {
    uint64_t got = 0;
    iovec local{&got, sizeof got};
    iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(all[2 * r + 1].item<int64_t>())),
                 sizeof got};
    const auto pid = static_cast<pid_t>(all[2 * r].item<int64_t>());
    ok &= process_vm_readv(pid, &local, 1, &remote, 1, 0) == 8 && got == word;
  }
  auto agreed = torch::tensor({ok});
  tdist::AllreduceOptions min;
  min.op = ReduceOp::MIN;
  pg().all_reduce(agreed, min)->wait();
  return agreed.item<int64_t>() != 0;
}

// Note [Plain tensors read across processes]: whether ranks may read each other's plain
// tensors in this run (TDIST_MPI_SHM_CMA not 0 and the kernel allows it), and whether an
// op of `bytes` (the larger of input and output) does (its size window).
bool may_read_plain_tensors_across_processes() {
  if (shm_off() || world() == 1) return false;
  const char* off = std::getenv("TDIST_MPI_SHM_CMA");
  if (off && std::string(off) == "0") return false;
  return kernel_allows_cross_process_reads();
}
bool reads_plain_tensors_across_processes(int64_t bytes, bool all_reduce) {
  return tdist::mpi::detail::peer_read_window(tdist::mpi::detail::MPIEnvironment::from_env(),
                                              all_reduce)
             .contains(bytes) &&
         may_read_plain_tensors_across_processes();
}

const std::vector<at::ScalarType> kReducible = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                                at::kByte,  at::kChar,   at::kInt,  at::kLong};

std::vector<ReduceOp> ops_for(at::ScalarType dtype) {
  if (at::isFloatingType(dtype)) {
    return {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX};
  }
  return {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX};
}

// Rank r's input: small integers, exact in every dtype (products of four ranks fit int8).
at::Tensor input_of(int r, int64_t n, at::ScalarType dtype, ReduceOp op, int salt = 0) {
  auto i = torch::arange(n, torch::kDouble) + salt;
  auto v = op == ReduceOp::PRODUCT ? torch::remainder(i + 3 * r, 2) + 1
                                   : torch::remainder(i * 5 + 3 * r, 7);
  return v.to(dtype);
}

// The reduction over all ranks (reduce_locally.h).
at::Tensor expected_reduction(int64_t n, at::ScalarType dtype, ReduceOp op, int salt = 0) {
  std::vector<at::Tensor> all;
  for (int r = 0; r < world(); ++r) all.push_back(input_of(r, n, dtype, op, salt));
  return tdist::mpi::testing::reduce_locally(all, op);
}

std::string describe(at::ScalarType dtype, ReduceOp op, int64_t n) {
  return std::string(c10::toString(dtype)) + "/" + tdist::to_string(op) + "/" + std::to_string(n);
}

// Sizes: 1 element, odd sizes not divisible by 2, 3 or 4, and some larger than a 4 KiB piece
// or (for the biggest) a default 256 KiB piece.
const std::vector<int64_t> kSizes = {1, 7, 1001, 4099, 300007};

TEST(MPIShm, AllReduceEveryDtypeOpAndSize) {
  for (int64_t n : kSizes) {
    for (auto dtype : kReducible) {
      for (auto op : ops_for(dtype)) {
        if (n > 5000 && dtype != at::kFloat && dtype != at::kBFloat16) continue;  // keep it quick
        auto t = input_of(rank(), n, dtype, op);
        tdist::AllreduceOptions opts;
        opts.op = op;
        pg().all_reduce(t, opts)->wait();
        auto want = expected_reduction(n, dtype, op);
        EXPECT_TRUE(t.equal(want)) << describe(dtype, op, n);
      }
    }
  }
}

TEST(MPIShm, ReduceScatterTensorEveryDtypeOpAndSize) {
  for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(1001), int64_t(70001)}) {
    for (auto dtype : kReducible) {
      for (auto op : ops_for(dtype)) {
        if (chunk > 5000 && dtype != at::kFloat && dtype != at::kHalf) continue;
        auto in = input_of(rank(), chunk * world(), dtype, op);
        auto out = torch::full({chunk}, 99, in.options());
        tdist::ReduceScatterOptions opts;
        opts.op = op;
        pg().reduce_scatter_tensor(out, in, opts)->wait();
        auto full = expected_reduction(chunk * world(), dtype, op);
        EXPECT_TRUE(out.equal(full.narrow(0, chunk * rank(), chunk))) << describe(dtype, op, chunk);
      }
    }
  }
}

TEST(MPIShm, AllGatherIntoTensorEveryDtypeAndSize) {
  auto dtypes = kReducible;
  dtypes.push_back(at::kBool);
  for (int64_t n : kSizes) {
    for (auto dtype : dtypes) {
      auto in = input_of(rank(), n, dtype, ReduceOp::SUM, /*salt=*/rank());
      auto out = torch::empty({n * world()}, in.options());
      pg().all_gather_into_tensor(out, in, {})->wait();
      for (int r = 0; r < world(); ++r) {
        EXPECT_TRUE(out.narrow(0, n * r, n).equal(input_of(r, n, dtype, ReduceOp::SUM, r)))
            << describe(dtype, ReduceOp::SUM, n) << " from rank " << r;
      }
    }
  }
}

// Note [Placed all-gather] (tdist/detail/comm/placed_all_gather.h): every rank's block reaches the
// placer exactly once, on whichever path this run's variant takes for the size (one step
// from mapped or plain tensors, staged pieces, MPI messages with shared memory off), with
// symmetric and plain inputs, and odd ranks running all_gather_into_tensor against it.
TEST(MPIShm, PlacedAllGatherHandsEveryBlockOnceAndMixesWithTheOrdinaryOne) {
  const int n = world();
  std::vector<tdist::WorkPtr> in_flight;
  for (int64_t per_rank : {int64_t(0), int64_t(1), int64_t(777), int64_t(70001), int64_t(300007)}) {
    for (bool symmetric : {false, true}) {
      if (symmetric && !tdist::symmetric_memory::is_available()) continue;
      const std::string what =
          std::string(symmetric ? "symmetric" : "plain") + " per_rank " + std::to_string(per_rank);
      auto plain = input_of(rank(), per_rank, at::kFloat, ReduceOp::SUM, /*salt=*/rank());
      at::Tensor in = plain;
      if (symmetric) {
        in = tdist::symmetric_memory::empty({per_rank}, torch::kFloat);
        in.copy_(plain);
      }
      // Rank c's block lands at block n-1-c: an order no dense output has.
      auto placed = torch::full({per_rank * n}, -1.0f);
      std::vector<int> calls(n, 0);
      const size_t bytes = in.nbytes();
      auto place = [&](int c, const char* block) {
        ++calls[c];
        std::memcpy(static_cast<char*>(placed.data_ptr()) + (n - 1 - c) * bytes, block, bytes);
      };
      ASSERT_TRUE(pg().supports_all_gather_placed());
      // Another op in flight before it: the gather waits its turn on the lane.
      auto other = input_of(rank(), 1001, at::kFloat, ReduceOp::SUM);
      in_flight.push_back(pg().all_reduce(other, {}));
      if (rank() % 2 == 1) {
        auto dense = torch::empty({per_rank * n});
        pg().all_gather_into_tensor(dense, in, {})->wait();
        for (int c = 0; c < n; ++c) {
          place(c, static_cast<const char*>(dense.data_ptr()) + c * bytes);
        }
      } else {
        pg().all_gather_placed(in, place, {})->wait();
      }
      for (int c = 0; c < n; ++c) {
        EXPECT_EQ(calls[c], 1) << what << " block " << c;
        EXPECT_TRUE(placed.narrow(0, (n - 1 - c) * per_rank, per_rank)
                        .equal(input_of(c, per_rank, at::kFloat, ReduceOp::SUM, c)))
            << what << " block of rank " << c;
      }
    }
  }
  for (auto& w : in_flight) w->wait();
}

TEST(MPIShm, ReductionIsALeftFoldInRankOrderAndBitwiseEqualOnEveryRank) {
  // Random values: the result depends on the order of the additions. Every rank must get
  // ((x0 + x1) + x2) + x3 exactly, computed in fp32 for bfloat16/half too.
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const int64_t n = 50021;
    auto value_of = [&](int r) {
      return torch::randn({n}, at::detail::createCPUGenerator(1000 + r)).to(dtype);
    };
    auto t = value_of(rank());
    pg().all_reduce(t, {})->wait();
    auto acc = value_of(0).to(torch::kFloat);
    for (int r = 1; r < world(); ++r) acc = acc + value_of(r).to(torch::kFloat);
    // (The MPI-message paths reduce in another order: only the shared-memory path folds.)
    if (!shm_off()) {
      EXPECT_TRUE(t.equal(acc.to(dtype))) << c10::toString(dtype);
    }
    // Every rank holds the same bits.
    auto all = torch::empty({n * world()}, t.options());
    pg().all_gather_into_tensor(all, t, {})->wait();
    for (int r = 0; r < world(); ++r) {
      EXPECT_TRUE(all.narrow(0, n * r, n).equal(t)) << c10::toString(dtype) << " rank " << r;
    }
  }
}

TEST(MPIShm, BackToBackOpsOfAlternatingSizesAndKindsInFlight) {
  // Issued without waiting: the ops of one communicator run one at a time in issue order.
  std::vector<at::Tensor> reduced, gathered, gather_in, scattered;
  std::vector<tdist::WorkPtr> works;
  const std::vector<int64_t> sizes = {3, 9000, 1, 300001, 17, 5000};
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    const int salt = static_cast<int>(k);
    reduced.push_back(input_of(rank(), n, at::kFloat, ReduceOp::SUM, salt));
    works.push_back(pg().all_reduce(reduced.back(), {}));
    gather_in.push_back(input_of(rank(), n, at::kInt, ReduceOp::SUM, salt + rank()));
    gathered.push_back(torch::empty({n * world()}, torch::kInt));
    works.push_back(pg().all_gather_into_tensor(gathered.back(), gather_in.back(), {}));
    auto rs_in = input_of(rank(), n * world(), at::kDouble, ReduceOp::SUM, salt);
    scattered.push_back(torch::empty({n}, torch::kDouble));
    works.push_back(pg().reduce_scatter_tensor(scattered.back(), rs_in, {}));
  }
  for (auto& w : works) w->wait();
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    const int salt = static_cast<int>(k);
    EXPECT_TRUE(reduced[k].equal(expected_reduction(n, at::kFloat, ReduceOp::SUM, salt))) << k;
    for (int r = 0; r < world(); ++r) {
      EXPECT_TRUE(
          gathered[k].narrow(0, n * r, n).equal(input_of(r, n, at::kInt, ReduceOp::SUM, salt + r)))
          << k;
    }
    auto full = expected_reduction(n * world(), at::kDouble, ReduceOp::SUM, salt);
    EXPECT_TRUE(scattered[k].equal(full.narrow(0, n * rank(), n))) << k;
  }
}

TEST(MPIShm, OpsOnOneTensorSeeEachOthersResults) {
  // A broadcast (MPI) then two all_reduces (shared memory, or MPI messages when it is off)
  // on one tensor, none waited for in between: each must see the previous result (Note [One
  // op per lane] in src/mpi/executor.cpp).
  auto t = torch::full({20000}, static_cast<float>(rank() + 1));
  tdist::BroadcastOptions from_last;
  from_last.root = world() - 1;
  auto b = pg().broadcast(t, from_last);
  auto r1 = pg().all_reduce(t, {});
  auto r2 = pg().all_reduce(t, {});
  r2->wait();
  b->wait();
  r1->wait();
  const float want = static_cast<float>(world()) * world() * world();
  EXPECT_TRUE(t.eq(want).all().item<bool>()) << t[0].item<float>() << " want " << want;
}

TEST(MPIShm, AnAsyncOpWhosePeerWaitsForThisRankFirstDoesNotDeadlock) {
  // Rank 0 issues an all_reduce (small enough to start on the calling thread, Note [Inline
  // start] in src/mpi/mpi_backend.cpp) and only then sends what rank 1 waits for before it
  // issues its all_reduce: the call must hand the op to the executor instead of waiting
  // for rank 1 inside all_reduce.
  if (world() < 2) GTEST_SKIP() << "needs two ranks";
  auto t = torch::full({1 << 18}, static_cast<float>(rank() + 1));
  auto token = torch::zeros({4});
  if (rank() == 0) {
    auto reduce = pg().all_reduce(t, {});
    pg().send(torch::ones({4}), 1, {})->wait();
    reduce->wait();
  } else if (rank() == 1) {
    pg().recv(token, 0, {})->wait();
    EXPECT_TRUE(token.eq(1).all().item<bool>());
    pg().all_reduce(t, {})->wait();
  } else {
    pg().all_reduce(t, {})->wait();
  }
  const float want = static_cast<float>(world() * (world() + 1) / 2);
  EXPECT_TRUE(t.eq(want).all().item<bool>()) << t[0].item<float>() << " want " << want;
}

TEST(MPIShm, NonContiguousAndStagedTensors) {
  auto base = torch::arange(3 * 1001, torch::kFloat).reshape({3, 1001});
  auto view = base.t();  // non-contiguous: staged, then copied back
  pg().all_reduce(view, {})->wait();
  EXPECT_TRUE(base.equal(torch::arange(3 * 1001, torch::kFloat).reshape({3, 1001}) * world()));
  // A non-contiguous all_gather output (a column of a matrix).
  auto in = torch::full({4, 1}, static_cast<double>(rank()), torch::kDouble);
  auto strided = torch::zeros({4 * world(), 2}, torch::kDouble).select(1, 0).unsqueeze(1);
  pg().all_gather_into_tensor(strided, in, {})->wait();
  for (int r = 0; r < world(); ++r) {
    EXPECT_EQ(strided[4 * r + 3][0].item<double>(), r);
  }
}

TEST(MPIShm, APeerThatNeverArrivesIsATimeoutNamingIt) {
  if (world() == 1) GTEST_SKIP() << "needs a peer";
  if (shm_off()) GTEST_SKIP() << "the shared-memory path is off";
  // A second backend over the world (its own segments), so this one breaking leaves pg() whole.
  auto other = std::make_shared<MPIBackend>(nullptr, rank(), world(), std::chrono::seconds(60));
  if (rank() == 0) {
    auto t = torch::ones({1000});
    tdist::AllreduceOptions opts;
    opts.timeout = std::chrono::milliseconds(300);
    auto work = other->all_reduce(t, opts);
    try {
      work->wait();
      FAIL() << "expected a timeout";
    } catch (const tdist::TimeoutError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank 1 has not"), std::string::npos) << what;
      EXPECT_NE(what.find("all_reduce"), std::string::npos) << what;
    }
    // The backend is broken now: further ops fail fast instead of hanging.
    EXPECT_THROW(other->all_reduce(t, {}), tdist::Error);
  }
  pg().barrier({})->wait();
}

// Note [Symmetric tensors over MPI shared memory]: tensors in symmetric memory on every rank
// (all_gather's output, reduce_scatter's input) are read from the peers directly; results
// equal the staged path's, and ops of both kinds interleave in flight.
TEST(MPIShm, SymmetricTensorsGiveTheStagedResultsAndMixWithStagedOps) {
  if (!tdist::symmetric_memory::is_available()) GTEST_SKIP() << "no symmetric memory here";
  std::vector<tdist::WorkPtr> works;
  std::vector<at::Tensor> gathered, gather_in, scattered, staged_gathered, symmetric_inputs;
  const std::vector<int64_t> sizes = {1, 1001, 300007};
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    const int salt = static_cast<int>(k);
    // all_gather into a symmetric output, the input a plain tensor...
    gather_in.push_back(input_of(rank(), n, at::kInt, ReduceOp::SUM, salt + rank()));
    gathered.push_back(tdist::symmetric_memory::empty({n * world()}, torch::kInt));
    works.push_back(pg().all_gather_into_tensor(gathered.back(), gather_in.back(), {}));
    // ... then a staged one in flight behind it ...
    staged_gathered.push_back(torch::empty({n * world()}, torch::kInt));
    works.push_back(pg().all_gather_into_tensor(staged_gathered.back(), gather_in.back(), {}));
    // ... and a reduce_scatter from a symmetric input.
    auto rs_in = tdist::symmetric_memory::empty({n * world()}, torch::kFloat);
    rs_in.copy_(input_of(rank(), n * world(), at::kFloat, ReduceOp::SUM, salt));
    symmetric_inputs.push_back(rs_in);  // kept alive until the op finished
    scattered.push_back(torch::full({n}, -1.0f));
    works.push_back(pg().reduce_scatter_tensor(scattered.back(), rs_in, {}));
  }
  for (auto& w : works) w->wait();
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    const int salt = static_cast<int>(k);
    EXPECT_TRUE(gathered[k].equal(staged_gathered[k])) << n;
    for (int r = 0; r < world(); ++r) {
      EXPECT_TRUE(
          gathered[k].narrow(0, n * r, n).equal(input_of(r, n, at::kInt, ReduceOp::SUM, salt + r)))
          << n << " from rank " << r;
    }
    auto full = expected_reduction(n * world(), at::kFloat, ReduceOp::SUM, salt);
    EXPECT_TRUE(scattered[k].equal(full.narrow(0, n * rank(), n))) << n;
  }
  // A symmetric input with a plain output: peers read the input.
  {
    const int64_t m = 70001;
    auto sym_in = tdist::symmetric_memory::empty({m}, torch::kFloat);
    sym_in.copy_(input_of(rank(), m, at::kFloat, ReduceOp::SUM, 3 + rank()));
    auto plain_out = torch::full({m * world()}, -1.0f);
    pg().all_gather_into_tensor(plain_out, sym_in, {})->wait();
    for (int r = 0; r < world(); ++r) {
      EXPECT_TRUE(
          plain_out.narrow(0, m * r, m).equal(input_of(r, m, at::kFloat, ReduceOp::SUM, 3 + r)))
          << "symmetric input, from rank " << r;
    }
  }
  // The input already in place as this rank's block of the output (as FSDP lays it out),
  // and an AVG reduce_scatter.
  const int64_t n = 4099;
  auto out = tdist::symmetric_memory::empty({n * world()}, torch::kDouble);
  auto mine = out.narrow(0, n * rank(), n);
  mine.copy_(input_of(rank(), n, at::kDouble, ReduceOp::SUM, 7));
  pg().all_gather_into_tensor(out, mine, {})->wait();
  for (int r = 0; r < world(); ++r) {
    EXPECT_TRUE(out.narrow(0, n * r, n).equal(input_of(r, n, at::kDouble, ReduceOp::SUM, 7))) << r;
  }
  auto avg_in = tdist::symmetric_memory::empty({n * world()}, torch::kDouble);
  avg_in.copy_(input_of(rank(), n * world(), at::kDouble, ReduceOp::AVG));
  auto avg_out = torch::empty({n}, torch::kDouble);
  tdist::ReduceScatterOptions avg;
  avg.op = ReduceOp::AVG;
  pg().reduce_scatter_tensor(avg_out, avg_in, avg)->wait();
  auto want = expected_reduction(n * world(), at::kDouble, ReduceOp::AVG).narrow(0, n * rank(), n);
  EXPECT_TRUE(avg_out.allclose(want, 0, 1e-12)) << (avg_out - want).abs().max().item<double>();
}

TEST(MPIShm, SymmetricAllReduceIsTheStagedLeftFoldForEveryOpAndSize) {
  if (!tdist::symmetric_memory::is_available()) GTEST_SKIP() << "no symmetric memory here";
  // Sizes from 1 element to several scratch blocks per chunk, every op, two dtypes; random
  // floats so the order of the additions shows, compared with the staged path's bits.
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(40009), int64_t(300007)}) {
    for (auto dtype : {at::kFloat, at::kInt}) {
      for (auto op : ops_for(dtype)) {
        auto plain = input_of(rank(), n, dtype, op, static_cast<int>(n % 5));
        if (dtype == at::kFloat && op == ReduceOp::SUM) {
          plain = torch::randn({n}, at::detail::createCPUGenerator(77 + rank()));
        }
        auto sym = tdist::symmetric_memory::empty({n}, dtype);
        sym.copy_(plain);
        tdist::AllreduceOptions opts;
        opts.op = op;
        auto a = pg().all_reduce(sym, opts);  // in flight together with a staged op
        auto b = pg().all_reduce(plain, opts);
        a->wait();
        b->wait();
        if (!shm_off()) {
          EXPECT_TRUE(sym.equal(plain)) << describe(dtype, op, n);
        }
        EXPECT_TRUE(sym.allclose(plain, 1e-6, 1e-5)) << describe(dtype, op, n);
        if (dtype == at::kInt) {
          EXPECT_TRUE(sym.equal(expected_reduction(n, dtype, op, static_cast<int>(n % 5))))
              << describe(dtype, op, n);
        }
      }
    }
  }
  // Back to back on one symmetric tensor: each sees the previous result.
  auto t = tdist::symmetric_memory::empty({100003}, torch::kDouble);
  t.fill_(1.0);
  auto w1 = pg().all_reduce(t, {});
  auto w2 = pg().all_reduce(t, {});
  w1->wait();
  w2->wait();
  EXPECT_TRUE(t.eq(static_cast<double>(world()) * world()).all().item<bool>()) << t[0];
}

TEST(MPIShm, SymmetricMemoryOnSomeRanksOnlyRaisesOnEveryRankUnlessPlainTensorsAreRead) {
  if (world() == 1) GTEST_SKIP() << "needs a peer";
  if (shm_off()) GTEST_SKIP() << "the shared-memory path is off";
  if (!tdist::symmetric_memory::is_available()) GTEST_SKIP() << "no symmetric memory here";
  // A second backend (its own segments): this one's failed op leaves pg() whole.
  auto other = std::make_shared<MPIBackend>(nullptr, rank(), world(), std::chrono::seconds(60));
  const int64_t n = 5000;
  auto in = torch::full({n}, static_cast<float>(rank()));
  auto out = rank() == 0 ? tdist::symmetric_memory::empty({n * world()}, torch::kFloat)
                         : torch::empty({n * world()}, torch::kFloat);
  // Note [Plain tensors read across processes]: when ranks may read plain tensors directly,
  // the ranks mix freely (rank 0's block is read from its symmetric output, the others' from
  // their processes); otherwise the mismatch is an error on every rank.
  if (reads_plain_tensors_across_processes(static_cast<int64_t>(out.nbytes()), false)) {
    other->all_gather_into_tensor(out, in, {})->wait();
    for (int r = 0; r < world(); ++r) {
      EXPECT_TRUE(out.narrow(0, n * r, n).eq(static_cast<float>(r)).all().item<bool>()) << r;
    }
  } else {
    try {
      other->all_gather_into_tensor(out, in, {})->wait();
      ADD_FAILURE() << "rank " << rank() << ": expected DistBackendError";
    } catch (const tdist::DistBackendError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank 0 passed a tensor in symmetric memory"), std::string::npos) << what;
      EXPECT_NE(what.find("all_gather_into_tensor"), std::string::npos) << what;
    }
  }
  pg().barrier({})->wait();
}

// A read across processes that fails (the peer exited, or its tensor is gone) raises
// DistBackendError naming the peer and the system error, never a crash or silent garbage.
TEST(MPIShm, AFailedReadAcrossProcessesNamesThePeer) {
  const bool allowed = kernel_allows_cross_process_reads();  // (else EPERM, not EFAULT)
  char buffer[64] = {};
  try {
    tdist::detail::read_peer_memory(getpid(), 7, /*remote=*/8, buffer, sizeof buffer,
                                    "mpi: rank 0: all_gather_into_tensor");
    FAIL() << "expected DistBackendError";
  } catch (const tdist::DistBackendError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("reading rank 7's tensor"), std::string::npos) << what;
    EXPECT_NE(what.find("all_gather_into_tensor"), std::string::npos) << what;
    if (allowed) {
      EXPECT_NE(what.find(std::strerror(EFAULT)), std::string::npos) << what;
    }
  }
}

// Note [Plain tensors read across processes]: the same ops on a backend that always stages
// (TDIST_MPI_SHM_CMA=0 when it was built) give bitwise the same results, for every kind of
// reduction, sizes from one element to many fold blocks, and symmetric and plain tensors
// mixed in one op.
TEST(MPIShm, PlainTensorsReadAcrossProcessesGiveTheStagedBits) {
  if (world() == 1 || shm_off()) GTEST_SKIP() << "needs the shared-memory path and a peer";
  if (!may_read_plain_tensors_across_processes()) {
    GTEST_SKIP() << "plain tensors are always staged in this run";
  }
  setenv("TDIST_MPI_SHM_CMA", "0", 1);
  auto staged = std::make_shared<MPIBackend>(nullptr, rank(), world(), std::chrono::seconds(60));
  staged->barrier({})->wait();  // builds its window while the variable is set
  unsetenv("TDIST_MPI_SHM_CMA");
  // Per-rank chunks of 70001 and 600007 floats: ops of 0.5-2.2 MiB and 4.6-9.2 MiB at world
  // 2-4, inside every op's default window.
  for (int64_t n : {int64_t(70001), int64_t(600007)}) {
    const bool direct = reads_plain_tensors_across_processes(n * world() * 4, true);
    for (auto op : ops_for(at::kFloat)) {
      auto x = op == ReduceOp::SUM
                   ? torch::randn({n * world()}, at::detail::createCPUGenerator(31 + rank()))
                   : input_of(rank(), n * world(), at::kFloat, op, 1);
      tdist::AllreduceOptions ar;
      ar.op = op;
      auto a = x.clone(), b = x.clone();
      pg().all_reduce(a, ar)->wait();
      staged->all_reduce(b, ar)->wait();
      EXPECT_TRUE(a.equal(b)) << "all_reduce " << describe(at::kFloat, op, n) << " direct "
                              << direct;
      tdist::ReduceScatterOptions rs;
      rs.op = op;
      auto c = torch::empty({n}), d = torch::empty({n});
      pg().reduce_scatter_tensor(c, x, rs)->wait();
      staged->reduce_scatter_tensor(d, x, rs)->wait();
      EXPECT_TRUE(c.equal(d)) << "reduce_scatter " << describe(at::kFloat, op, n);
    }
    auto in = input_of(rank(), n, at::kInt, ReduceOp::SUM, rank());
    auto e = torch::empty({n * world()}, torch::kInt), f = torch::empty({n * world()}, torch::kInt);
    pg().all_gather_into_tensor(e, in, {})->wait();
    staged->all_gather_into_tensor(f, in, {})->wait();
    EXPECT_TRUE(e.equal(f)) << "all_gather " << n;
  }
  if (!tdist::symmetric_memory::is_available()) return;
  // Odd ranks symmetric, even ranks plain: one op reads both kinds (an all_reduce of 4.6 MiB
  // or more: inside its default window).
  const int64_t n = 600007;
  auto plain = torch::randn({n * world()}, at::detail::createCPUGenerator(57 + rank()));
  auto mixed = rank() % 2 ? tdist::symmetric_memory::empty({n * world()}, torch::kFloat)
                          : torch::empty({n * world()});
  mixed.copy_(plain);
  auto out = torch::empty({n});
  pg().reduce_scatter_tensor(out, mixed, {})->wait();
  auto want = torch::empty({n});
  staged->reduce_scatter_tensor(want, plain, {})->wait();
  EXPECT_TRUE(out.equal(want));
  pg().all_reduce(mixed, {})->wait();
  staged->all_reduce(plain, {})->wait();
  EXPECT_TRUE(mixed.equal(plain));
}

}  // namespace

// Misuse: bad arguments fail at the call with InvalidArgument; mismatches across ranks fail
// at wait() with DistBackendError on the ranks that see them; a silent peer times out and
// the group refuses later work.

#include <signal.h>

#include <atomic>
#include <thread>

#include "comm_gloo/gloo_test_util.h"
#include "tdist/error.h"
#include "tdist/store/hash_store.h"

namespace tdist::testing {
namespace {

using namespace std::chrono_literals;

template <typename E, typename F>
std::string expect_throw(F&& f, const std::string& what) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << what << ": did not throw";
  return "";
}

TEST(GlooErrors, BadArgumentsAreRejectedAtTheCall) {
  run_gloo(2, [&](GlooBackend& b, int rank, int n) {
    at::Tensor f = torch::ones({4});
    BroadcastOptions bad_root;
    bad_root.root = 2;
    auto msg = expect_throw<InvalidArgument>([&] { b.broadcast(f, bad_root); }, "bad root");
    EXPECT_NE(msg.find("root 2"), std::string::npos) << msg;
    ReduceOptions neg_root;
    neg_root.root = -1;
    expect_throw<InvalidArgument>([&] { b.reduce(f, neg_root); }, "negative root");

    AllreduceOptions band;
    band.op = ReduceOp::BAND;
    msg = expect_throw<InvalidArgument>([&] { b.all_reduce(f, band); }, "BAND on float");
    EXPECT_NE(msg.find("BAND"), std::string::npos) << msg;
    at::Tensor flag = torch::ones({4}, torch::kBool);
    AllreduceOptions avg;
    avg.op = ReduceOp::AVG;
    expect_throw<InvalidArgument>([&] { b.all_reduce(flag, avg); }, "AVG on bool");

    at::Tensor wrong = torch::empty({4 * n + 1});
    msg = expect_throw<InvalidArgument>([&] { b.all_gather_into_tensor(wrong, f, {}); }, "ag size");
    EXPECT_NE(msg.find("world_size"), std::string::npos) << msg;
    at::Tensor out = torch::empty({3});
    expect_throw<InvalidArgument>([&] { b.reduce_scatter_tensor(out, f, {}); }, "rs size");
    at::Tensor ints = torch::empty({4 * n}, torch::kInt);
    msg = expect_throw<InvalidArgument>([&] { b.all_gather_into_tensor(ints, f, {}); }, "dtype");
    EXPECT_NE(msg.find("dtype"), std::string::npos) << msg;
    std::vector<at::Tensor> one = {torch::empty({4})};
    expect_throw<InvalidArgument>([&] { b.all_gather(one, f, {}); }, "list length");
    expect_throw<InvalidArgument>([&] { b.all_to_all_single(f, f, {1, 1}, {3, 3}, {}); }, "splits");
    at::Tensor complex = torch::ones({2}, torch::kComplexFloat);
    expect_throw<InvalidArgument>([&] { b.all_reduce(complex, {}); }, "complex dtype");
    expect_throw<InvalidArgument>([&] { b.send(f, rank, {}); }, "send to self");
    expect_throw<InvalidArgument>([&] { b.recv(f, 7, {}); }, "recv from outside");
    // None of that touched the group.
    at::Tensor t = torch::ones({4});
    b.all_reduce(t, {})->wait();
    EXPECT_TRUE(torch::all(t == float(n)).item<bool>());
    EXPECT_FALSE(b.is_broken());
  });
}

TEST(GlooErrors, SizeMismatchAcrossRanksRaisesOnEveryRank) {
  run_gloo(3, [&](GlooBackend& b, int rank, int) {
    at::Tensor t = torch::ones({rank == 1 ? 6 : 5});
    auto msg =
        expect_throw<DistBackendError>([&] { b.all_reduce(t, {})->wait(); }, "size mismatch");
    EXPECT_NE(msg.find("all_reduce"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  });
}

TEST(GlooErrors, DifferentCollectivesAcrossRanksRaise) {
  run_gloo(2, [&](GlooBackend& b, int rank, int) {
    at::Tensor t = torch::ones({8});
    auto msg = expect_throw<DistBackendError>(
        [&] {
          if (rank == 0) {
            b.all_reduce(t, {})->wait();
          } else {
            b.broadcast(t, {})->wait();
          }
        },
        "op mismatch");
    EXPECT_NE(msg.find("broadcast"), std::string::npos) << msg;
  });
}

TEST(GlooErrors, AllToAllSplitMismatchRaises) {
  run_gloo(2, [&](GlooBackend& b, int rank, int) {
    at::Tensor in = torch::ones({4});
    at::Tensor out = torch::ones({rank == 0 ? 5 : 4});
    // rank 0 expects 3 rows from rank 1, which sends only 2.
    std::vector<int64_t> out_splits =
        rank == 0 ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{2, 2};
    expect_throw<DistBackendError>(
        [&] {
          b.all_to_all_single(out, in, out_splits, {2, 2}, {})->wait();
        },
        "split mismatch");
  });
}

TEST(GlooErrors, RecvOfTheWrongSizeFailsCleanly) {
  run_gloo(2, [&](GlooBackend& b, int rank, int) {
    if (rank == 0) {
      b.send(torch::ones({10}), 1, {})->wait();
    } else {
      at::Tensor small = torch::zeros({4});
      auto msg = expect_throw<InvalidArgument>([&] { b.recv(small, 0, {})->wait(); }, "recv size");
      EXPECT_NE(msg.find("10 elements"), std::string::npos) << msg;
    }
    // The pair is still in step.
    at::Tensor t = torch::ones({3});
    b.all_reduce(t, {})->wait();
    EXPECT_TRUE(torch::all(t == 2.0f).item<bool>());
  });
}

TEST(GlooErrors, SilentPeerTimesOutAndTheGroupIsBroken) {
  std::atomic<bool> rank0_done{false};
  run_gloo(2, [&](GlooBackend& b, int rank, int) {
    if (rank == 1) {
      // Never joins the collective; waits until rank 0 has checked everything.
      while (!rank0_done) std::this_thread::sleep_for(5ms);
      return;
    }
    at::Tensor t = torch::ones({4});
    AllreduceOptions opts;
    opts.timeout = 300ms;
    auto start = std::chrono::steady_clock::now();
    auto msg = expect_throw<TimeoutError>([&] { b.all_reduce(t, opts)->wait(); }, "timeout");
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_GE(took, 290ms);
    EXPECT_NE(msg.find("all_reduce"), std::string::npos) << msg;
    EXPECT_NE(msg.find("#1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    EXPECT_TRUE(b.is_broken());
    start = std::chrono::steady_clock::now();
    expect_throw<DistBackendError>([&] { b.all_reduce(t, {})->wait(); }, "broken");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
    rank0_done = true;
  });
}

TEST(GlooErrors, WorldOfOneNeedsNoPeers) {
  run_gloo(1, [&](GlooBackend& b, int, int) {
    at::Tensor t = torch::arange(5).to(torch::kFloat);
    AllreduceOptions avg;
    avg.op = ReduceOp::AVG;
    b.all_reduce(t, avg)->wait();
    EXPECT_TRUE(torch::equal(t, torch::arange(5).to(torch::kFloat)));
    b.barrier({})->wait();
  });
}

TEST(GlooErrors, ConstructorValidates) {
  auto store = std::make_shared<HashStore>();
  EXPECT_THROW(GlooBackend(store, 2, 2, std::chrono::seconds(1)), InvalidArgument);
  EXPECT_THROW(GlooBackend(store, 0, 0, std::chrono::seconds(1)), InvalidArgument);
  EXPECT_THROW(GlooBackend(nullptr, 0, 1, std::chrono::seconds(1)), InvalidArgument);
}

// A peer that never connects: the rendezvous store's own TimeoutError comes out of the
// constructor as it is (it crosses the Gloo transport module), not as a generic connect error.
TEST(GlooErrors, PeerThatNeverConnectsTimesOutAtConstruction) {
  auto store = std::make_shared<HashStore>();
  const auto msg = expect_throw<TimeoutError>(
      [&] { GlooBackend(store, 0, 2, std::chrono::milliseconds(500)); }, "absent peer");
  EXPECT_FALSE(msg.empty());
}

void program_sigpipe_handler(int) {}

sighandler_t sigpipe_disposition() {
  struct sigaction current {};
  sigaction(SIGPIPE, nullptr, &current);
  return current.sa_handler;
}

// See Note [SIGPIPE] in src/gloo/gloo_comm.cpp: a survivor writing to a dead peer's
// socket must get a NetworkError, not die of SIGPIPE (seen once in CI as "signal 13").
TEST(GlooErrors, SigpipeIsIgnoredUnlessTheProgramHandlesIt) {
  struct sigaction saved {};
  sigaction(SIGPIPE, nullptr, &saved);
  auto one_all_reduce = [](GlooBackend& b, int, int) {
    at::Tensor t = torch::ones({4});
    b.all_reduce(t, {})->wait();
  };
  signal(SIGPIPE, SIG_DFL);
  run_gloo(2, one_all_reduce);
  EXPECT_EQ(sigpipe_disposition(), SIG_IGN);
  signal(SIGPIPE, program_sigpipe_handler);
  run_gloo(2, one_all_reduce);
  EXPECT_EQ(sigpipe_disposition(), &program_sigpipe_handler);
  sigaction(SIGPIPE, &saved, nullptr);
}

}  // namespace
}  // namespace tdist::testing

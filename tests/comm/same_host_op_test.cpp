// The same-host engine (tdist/detail/comm/engine/same_host.h) on its own: ranks as threads of this
// process over an in-memory channel with tiny pieces and a wait that sometimes hands control
// back, so every op runs as many resumed pieces. Results are checked bitwise against a left
// fold over ranks computed here, for staged, plain-direct and symmetric tensors, at worlds
// 2-4, and with the op sizes that leave pieces, chunks and blocks uneven.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "tdist/comm/symmetric_memory.h"
#include "tdist/detail/comm/engine/reduce_kernels.h"
#include "tdist/detail/comm/engine/same_host.h"
#include "tdist/error.h"

// Named: test_comm is one unity translation unit.
namespace same_host_op_test {

using tdist::ReduceOp;
using tdist::detail::PieceAnnouncement;
using tdist::detail::PiecePhase;
using tdist::detail::SameHostChannel;
using tdist::detail::SameHostOp;
using tdist::detail::span_of;

// What the ranks of one test share: staging halves, flags, announcements.
struct Host {
  Host(int n, int64_t piece_bytes)
      : size(n),
        piece(piece_bytes),
        halves(static_cast<size_t>(n), std::vector<char>(2 * static_cast<size_t>(piece_bytes))),
        arrived(static_cast<size_t>(n)),
        reduced(static_cast<size_t>(n)),
        announcements(static_cast<size_t>(n) * 2) {}
  int size;
  int64_t piece;
  std::vector<std::vector<char>> halves;
  std::vector<std::atomic<uint64_t>> arrived, reduced;
  std::vector<PieceAnnouncement> announcements;  // [rank * 2 + seq % 2]
};

struct Options {
  bool plain_direct = false;  // peers read plain tensors (read_peer: this process's memory)
  bool empty_pieces = false;
  bool own_part_first = false;  // arrival_blocks(): each rank's own part before it arrives
};

class ThreadChannel final : public SameHostChannel {
 public:
  ThreadChannel(Host& host, int rank, Options options)
      : host_(host), rank_(rank), options_(options) {}

  int rank() const override { return rank_; }
  int size() const override { return host_.size; }
  int64_t piece_bytes() const override { return host_.piece; }
  bool runs_empty_ops() const override { return options_.empty_pieces; }
  bool reads_plain_tensors(int64_t, bool) const override { return options_.plain_direct; }
  bool arrival_blocks() const override { return options_.own_part_first; }
  uint64_t take_seq() override { return next_seq_++; }
  char* my_half(uint64_t seq, size_t bytes) override {
    EXPECT_LE(bytes, static_cast<size_t>(host_.piece)) << "a piece outgrew its half";
    return half(rank_, seq);
  }
  bool arrive(uint64_t seq, const PieceAnnouncement& mine, const std::vector<size_t>&) override {
    host_.announcements[static_cast<size_t>(rank_) * 2 + seq % 2] = mine;
    flag(rank_, PiecePhase::kArrived).store(seq, std::memory_order_release);
    return true;
  }
  void signal(PiecePhase phase, uint64_t seq) override {
    flag(rank_, phase).store(seq, std::memory_order_release);
  }
  // Hands control back on every third call, as a polled backend's executor would see it.
  bool wait(int peer, PiecePhase phase, uint64_t seq, const char* what) override {
    if (++waits_ % 3 == 0) return false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (flag(peer, phase).load(std::memory_order_acquire) < seq) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error(describe() + ": rank " + std::to_string(peer) + " has not " +
                                 what);
      }
      std::this_thread::yield();
    }
    return true;
  }
  PieceAnnouncement announcement(int peer, uint64_t seq) const override {
    return host_.announcements[static_cast<size_t>(peer) * 2 + seq % 2];
  }
  const char* peer_half(int peer, uint64_t seq) const override { return half(peer, seq); }
  tdist::detail::SymmetricMappings& symmetric_mappings() override { return mappings_; }
  void read_peer(int, uint64_t address, void* dst, size_t bytes) override {
    std::memcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(address)), bytes);
  }
  std::vector<char>& scratch(int i) override { return scratch_[i]; }
  std::string describe() const override { return "test rank " + std::to_string(rank_); }

 private:
  char* half(int r, uint64_t seq) const {
    return const_cast<char*>(host_.halves[static_cast<size_t>(r)].data()) + (seq % 2) * host_.piece;
  }
  std::atomic<uint64_t>& flag(int r, PiecePhase phase) const {
    auto& flags = phase == PiecePhase::kReduced ? host_.reduced : host_.arrived;
    return flags[static_cast<size_t>(r)];
  }

  Host& host_;
  int rank_;
  Options options_;
  uint64_t next_seq_ = 1;
  uint64_t waits_ = 0;
  tdist::detail::SymmetricMappings mappings_;
  std::vector<char> scratch_[3];
};

// Runs body(channel) on `n` threads, one per rank; rethrows the first failure.
void run_ranks(int n, int64_t piece_bytes, Options options,
               const std::function<void(ThreadChannel&)>& body) {
  Host host(n, piece_bytes);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadChannel channel(host, r, options);
        body(channel);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

tdist::detail::FoldFn sum_fold() {
  return tdist::detail::raw_reduce_fn(ReduceOp::SUM, at::kFloat);
}

// Values whose float sums depend on the order they are added in.
at::Tensor rank_values(int rank, int64_t numel) {
  return at::randn({numel}, at::detail::createCPUGenerator(100 + rank)) *
         std::pow(10.0, rank % 3 * 3);
}

// ((x0 + x1) + x2) + ... elementwise, in float.
at::Tensor left_fold(const std::vector<at::Tensor>& xs) {
  at::Tensor acc = xs[0] + xs[1];
  for (size_t p = 2; p < xs.size(); ++p) acc = acc + xs[p];
  return acc;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() &&
         (a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

at::Tensor buffer(bool symmetric, int64_t numel) {
  return symmetric ? tdist::symmetric_memory::empty({numel}, at::kFloat)
                   : at::empty({numel}, at::kFloat);
}

struct Case {
  int world;
  int64_t numel;
  Options options;
  bool symmetric;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  for (int world : {2, 3, 4}) {
    for (int64_t numel : {int64_t(1), int64_t(7), int64_t(97), int64_t(20000)}) {
      all.push_back({world, numel, {}, false});
      all.push_back({world, numel, {true, false, false}, false});
      all.push_back({world, numel, {false, true, true}, false});  // as the Gloo engine runs
      if (tdist::symmetric_memory::is_available()) {
        all.push_back({world, numel, {}, true});
        all.push_back({world, numel, {false, true, true}, true});
      }
    }
  }
  return all;
}

std::string name_of(const Case& c) {
  return "world " + std::to_string(c.world) + ", " + std::to_string(c.numel) + " elements, " +
         (c.symmetric              ? "symmetric"
          : c.options.plain_direct ? "plain direct"
                                   : "staged") +
         (c.options.own_part_first ? ", own part first" : "");
}

// 72 bytes a piece: 18 floats, uneven over 4 ranks and over most sizes.
constexpr int64_t kPieceBytes = 72;

TEST(SameHostOp, AllReduceIsTheLeftFoldOnEveryRank) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    std::vector<at::Tensor> inputs, results(static_cast<size_t>(c.world));
    for (int r = 0; r < c.world; ++r) inputs.push_back(rank_values(r, c.numel));
    run_ranks(c.world, kPieceBytes, c.options, [&](ThreadChannel& ch) {
      at::Tensor t = buffer(c.symmetric, c.numel);
      t.copy_(inputs[static_cast<size_t>(ch.rank())]);
      SameHostOp::all_reduce(ch, span_of(t), sum_fold())->run();
      results[static_cast<size_t>(ch.rank())] = t.clone();
    });
    const at::Tensor expected = left_fold(inputs);
    for (int r = 0; r < c.world; ++r) {
      EXPECT_TRUE(bitwise_equal(results[static_cast<size_t>(r)], expected)) << "rank " << r;
    }
  }
}

TEST(SameHostOp, ReduceScatterIsTheLeftFoldOfEachBlock) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    std::vector<at::Tensor> inputs, results(static_cast<size_t>(c.world));
    for (int r = 0; r < c.world; ++r) inputs.push_back(rank_values(r, c.numel * c.world));
    run_ranks(c.world, kPieceBytes * c.world, c.options, [&](ThreadChannel& ch) {
      at::Tensor in = buffer(c.symmetric, c.numel * c.world);
      in.copy_(inputs[static_cast<size_t>(ch.rank())]);
      at::Tensor out = at::empty({c.numel}, at::kFloat);
      SameHostOp::reduce_scatter(ch, span_of(in), span_of(out), sum_fold())->run();
      results[static_cast<size_t>(ch.rank())] = out;
    });
    const at::Tensor expected = left_fold(inputs);
    for (int r = 0; r < c.world; ++r) {
      EXPECT_TRUE(bitwise_equal(results[static_cast<size_t>(r)],
                                expected.narrow(0, r * c.numel, c.numel).contiguous()))
          << "rank " << r;
    }
  }
}

TEST(SameHostOp, AllGatherAndPlacedAllGatherHaveEveryRanksBlock) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    std::vector<at::Tensor> inputs, gathered(static_cast<size_t>(c.world)),
        placed(static_cast<size_t>(c.world));
    for (int r = 0; r < c.world; ++r) inputs.push_back(rank_values(r, c.numel));
    run_ranks(c.world, kPieceBytes, c.options, [&](ThreadChannel& ch) {
      at::Tensor in = buffer(c.symmetric, c.numel);
      in.copy_(inputs[static_cast<size_t>(ch.rank())]);
      at::Tensor out = at::full({c.numel * c.world}, -1.0f);
      SameHostOp::all_gather(ch, span_of(in), span_of(out))->run();
      gathered[static_cast<size_t>(ch.rank())] = out;
      at::Tensor blocks = at::full({c.numel * c.world}, -1.0f);
      std::vector<int> calls(static_cast<size_t>(c.world), 0);
      SameHostOp::all_gather_placed(ch, span_of(in), [&](int rank, const void* block) {
        ++calls[static_cast<size_t>(rank)];
        std::memcpy(blocks.data_ptr<float>() + rank * c.numel, block, c.numel * sizeof(float));
      })->run();
      for (int r = 0; r < c.world; ++r) EXPECT_EQ(calls[static_cast<size_t>(r)], 1) << r;
      placed[static_cast<size_t>(ch.rank())] = blocks;
    });
    const at::Tensor expected = at::cat(inputs);
    for (int r = 0; r < c.world; ++r) {
      EXPECT_TRUE(bitwise_equal(gathered[static_cast<size_t>(r)], expected)) << "rank " << r;
      EXPECT_TRUE(bitwise_equal(placed[static_cast<size_t>(r)], expected)) << "rank " << r;
    }
  }
}

TEST(SameHostOp, BroadcastAndAllToAllRunAsPieces) {
  for (int world : {2, 3, 4}) {
    for (int64_t numel : {int64_t(0), int64_t(5), int64_t(1000)}) {
      for (bool empty_pieces : {false, true}) {
        SCOPED_TRACE("world " + std::to_string(world) + ", " + std::to_string(numel) + " elements" +
                     (empty_pieces ? ", empty pieces run" : ""));
        const int root = world - 1;
        std::vector<at::Tensor> inputs;
        for (int r = 0; r < world; ++r) inputs.push_back(rank_values(r, numel * world));
        Options options;
        options.empty_pieces = empty_pieces;
        run_ranks(world, kPieceBytes * world, options, [&](ThreadChannel& ch) {
          const int r = ch.rank();
          // Several broadcasts in a row: a root that ran ahead would overwrite a half its
          // peers still read.
          for (int round = 0; round < 3; ++round) {
            at::Tensor t = r == root ? (inputs[static_cast<size_t>(root)] + round).contiguous()
                                     : at::full({numel * world}, -1.0f);
            SameHostOp::broadcast(ch, span_of(t), root)->run();
            EXPECT_TRUE(bitwise_equal(t, inputs[static_cast<size_t>(root)] + round))
                << "rank " << r << ", round " << round;
          }
          at::Tensor out = at::full({numel * world}, -1.0f);
          SameHostOp::all_to_all(ch, span_of(inputs[static_cast<size_t>(r)]), span_of(out))->run();
          for (int c = 0; c < world; ++c) {
            EXPECT_TRUE(bitwise_equal(
                out.narrow(0, c * numel, numel).contiguous(),
                inputs[static_cast<size_t>(c)].narrow(0, r * numel, numel).contiguous()))
                << "rank " << r << ", block " << c;
          }
        });
      }
    }
  }
}

TEST(SameHostOp, AveragingFinishesEveryElementOnce) {
  for (int world : {2, 3}) {
    std::vector<at::Tensor> inputs, results(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) inputs.push_back(rank_values(r, 101));
    run_ranks(world, kPieceBytes, {}, [&](ThreadChannel& ch) {
      at::Tensor t = inputs[static_cast<size_t>(ch.rank())].clone();
      auto divide = [world](void* p, size_t n) {
        ASSERT_TRUE(tdist::detail::raw_divide(p, n, at::kFloat, world));
      };
      SameHostOp::all_reduce(ch, span_of(t), sum_fold(), divide)->run();
      results[static_cast<size_t>(ch.rank())] = t;
    });
    at::Tensor expected = left_fold(inputs).div_(world);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(bitwise_equal(results[static_cast<size_t>(r)], expected)) << "rank " << r;
    }
  }
}

TEST(SameHostOp, RanksOnDifferentPathsRaiseNamingBoth) {
  if (!tdist::symmetric_memory::is_available()) GTEST_SKIP() << "no POSIX shared memory here";
  std::vector<std::string> messages(2);
  run_ranks(2, kPieceBytes, {}, [&](ThreadChannel& ch) {
    at::Tensor t = buffer(/*symmetric=*/ch.rank() == 0, 64);
    t.fill_(1.0f);
    try {
      SameHostOp::all_reduce(ch, span_of(t), sum_fold())->run();
    } catch (const tdist::DistBackendError& e) {
      messages[static_cast<size_t>(ch.rank())] = e.what();
    }
  });
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("rank 0 passed a tensor in symmetric memory and rank 1 did not"),
              std::string::npos)
        << m;
  }
}

}  // namespace same_host_op_test

// bench_soak: runs mixed collectives (all_reduce, all_gather_into_tensor,
// reduce_scatter_tensor, broadcast, all_to_all_single, send/recv) on several process groups
// concurrently, one thread per group, for --seconds; checks every result against values
// computed independently, and prints per-op counts and the number of wrong results.
// Exit code 0 only if nothing was wrong and nothing failed.
//
//   tdistrun --standalone --nproc-per-node 3 bench_soak --seconds 60 [--threads 4]
//       [--max-numel 4096] [--timeout-ms 30000] [--seed 1]
//
// Every member of a group derives the same op, dtype and size from (seed, group, iteration),
// so the ranks stay in step without talking; an all_reduce(MAX) of "my time is up" after
// each iteration makes them stop together.

#include <torch/torch.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tdist/comm/distributed.h"
#include "tdist/comm/flight_recorder.h"
#include "tdist/error.h"

namespace {

using Clock = std::chrono::steady_clock;

enum Op { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kAllToAll, kSendRecv, kNumOps };
const std::array<const char*, kNumOps> kOpNames = {
    "all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
    "broadcast",  "all_to_all_single",      "send/recv"};

struct Args {
  double seconds = 10;
  int threads = 4;
  int64_t max_numel = 4096;
  int64_t timeout_ms = 30000;
  uint64_t seed = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--seconds") {
      a.seconds = std::stod(value());
    } else if (flag == "--threads") {
      a.threads = std::stoi(value());
    } else if (flag == "--max-numel") {
      a.max_numel = std::stoll(value());
    } else if (flag == "--timeout-ms") {
      a.timeout_ms = std::stoll(value());
    } else if (flag == "--seed") {
      a.seed = std::stoull(value());
    } else if (flag == "--help" || flag == "-h") {
      std::cout << "usage: bench_soak [--seconds S] [--threads T] [--max-numel N] "
                   "[--timeout-ms MS] [--seed K]\n";
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown flag " + flag + " (see --help)");
    }
  }
  if (a.seconds <= 0 || a.threads < 1 || a.max_numel < 1 || a.timeout_ms < 1) {
    throw std::invalid_argument("--seconds, --threads, --max-numel and --timeout-ms must be > 0");
  }
  return a;
}

/// Rank r's value at index i of iteration it (small integers: exact in every dtype used).
at::Tensor values(int r, int64_t it, int64_t offset, int64_t numel, at::ScalarType dtype) {
  auto i = torch::arange(offset, offset + numel, torch::kLong);
  return ((i + it) % 97 + (r + 1) * 1000).to(dtype);
}

struct Counts {
  std::array<int64_t, kNumOps> ops{};
  int64_t wrong = 0;
  int64_t iterations = 0;
  std::string first_wrong;
};

class Worker {
 public:
  Worker(int index, tdist::ProcessGroupPtr group, const Args& args)
      : index_(index), group_(std::move(group)), args_(args) {}

  void run(Clock::time_point deadline) {
    tdist::CollectiveLabelScope label("soak thread " + std::to_string(index_));
    const int n = group_->size();
    const int me = group_->rank();
    for (int64_t it = 0;; ++it) {
      std::mt19937_64 rng(args_.seed * 1000003 + static_cast<uint64_t>(index_) * 7919 + it);
      Op op = static_cast<Op>(rng() % kNumOps);
      if (op == kSendRecv && n < 2) op = kAllReduce;
      const int64_t numel = 1 + static_cast<int64_t>(rng() % args_.max_numel);
      const at::ScalarType dtype =
          std::array<at::ScalarType, 3>{at::kFloat, at::kDouble, at::kLong}[rng() % 3];
      step(op, it, numel, dtype, n, me, static_cast<int>(rng() % n));
      ++counts_.ops[op];
      ++counts_.iterations;
      at::Tensor stop = torch::full({1}, Clock::now() >= deadline ? 1 : 0, torch::kLong);
      tdist::all_reduce(stop, tdist::ReduceOp::MAX, group_);
      if (stop.item<int64_t>() != 0) break;
    }
  }

  const Counts& counts() const { return counts_; }

 private:
  void check(const at::Tensor& got, const at::Tensor& want, Op op, int64_t it) {
    if (torch::equal(got, want)) return;
    if (++counts_.wrong == 1) {
      counts_.first_wrong = std::string(kOpNames[op]) + " iteration " + std::to_string(it) +
                            " on group " + group_->name();
    }
  }

  int global(int group_rank) const { return group_->global_rank(group_rank); }

  void step(Op op, int64_t it, int64_t numel, at::ScalarType dtype, int n, int me, int root) {
    switch (op) {
      case kAllReduce: {
        at::Tensor t = values(me, it, 0, numel, dtype);
        tdist::all_reduce(t, tdist::ReduceOp::SUM, group_);
        at::Tensor want = torch::zeros({numel}, torch::kLong);
        for (int r = 0; r < n; ++r) want += values(r, it, 0, numel, torch::kLong);
        check(t, want.to(dtype), op, it);
        break;
      }
      case kAllGather: {
        at::Tensor out = torch::zeros({numel * n}, dtype);
        tdist::all_gather_into_tensor(out, values(me, it, 0, numel, dtype), group_);
        std::vector<at::Tensor> parts;
        for (int r = 0; r < n; ++r) parts.push_back(values(r, it, 0, numel, dtype));
        check(out, torch::cat(parts), op, it);
        break;
      }
      case kReduceScatter: {
        at::Tensor out = torch::zeros({numel}, dtype);
        tdist::reduce_scatter_tensor(out, values(me, it, 0, numel * n, dtype), tdist::ReduceOp::SUM,
                                     group_);
        at::Tensor want = torch::zeros({numel}, torch::kLong);
        for (int r = 0; r < n; ++r) want += values(r, it, me * numel, numel, torch::kLong);
        check(out, want.to(dtype), op, it);
        break;
      }
      case kBroadcast: {
        at::Tensor t = me == root ? values(me, it, 0, numel, dtype) : torch::zeros({numel}, dtype);
        tdist::broadcast(t, global(root), group_);
        check(t, values(root, it, 0, numel, dtype), op, it);
        break;
      }
      case kAllToAll: {
        // Block d of rank r's input goes to rank d; its values say where it came from.
        const int64_t block = 1 + numel / n;
        std::vector<at::Tensor> in, want;
        for (int d = 0; d < n; ++d) in.push_back(values(me * n + d, it, 0, block, dtype));
        for (int s = 0; s < n; ++s) want.push_back(values(s * n + me, it, 0, block, dtype));
        at::Tensor out = torch::zeros({block * n}, dtype);
        tdist::all_to_all_single(out, torch::cat(in), {}, {}, group_);
        check(out, torch::cat(want), op, it);
        break;
      }
      case kSendRecv: {
        // A ring: send to the next rank, receive from the previous one.
        const int next = (me + 1) % n, prev = (me + n - 1) % n;
        at::Tensor in = torch::zeros({numel}, dtype);
        auto recv = tdist::irecv(in, global(prev), group_, static_cast<int>(it % 1000));
        auto send = tdist::isend(values(me, it, 0, numel, dtype), global(next), group_,
                                 static_cast<int>(it % 1000));
        const auto bound = group_->timeout() + std::chrono::seconds(5);
        send->wait(bound);
        recv->wait(bound);
        check(in, values(prev, it, 0, numel, dtype), op, it);
        break;
      }
      case kNumOps:
        break;
    }
  }

  int index_;
  tdist::ProcessGroupPtr group_;
  Args args_;
  Counts counts_;
};

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "bench_soak: error: " << e.what() << "\n";
    return 2;
  }
  torch::set_num_threads(1);
  int rank = -1;
  try {
    tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo").timeout(
        std::chrono::milliseconds(args.timeout_ms)));
    rank = tdist::get_rank();
    const int world = tdist::get_world_size();
    // Even threads use the whole world; odd ones (world >= 3) a group without one rank, so
    // that groups of different membership run side by side.
    std::vector<tdist::ProcessGroupPtr> groups;
    for (int t = 0; t < args.threads; ++t) {
      std::vector<int> ranks;
      for (int r = 0; r < world; ++r) {
        if (t % 2 == 1 && world >= 3 && r == (t / 2) % world) continue;
        ranks.push_back(r);
      }
      groups.push_back(tdist::new_group(ranks));
    }
    std::vector<std::unique_ptr<Worker>> workers;
    std::vector<std::thread> threads;
    std::mutex errors_mutex;
    std::vector<std::string> errors;
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(args.seconds));
    for (int t = 0; t < args.threads; ++t) {
      workers.push_back(std::make_unique<Worker>(t, groups[t], args));
      if (!groups[t]->is_member()) continue;
      threads.emplace_back([&, t] {
        try {
          workers[t]->run(deadline);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(errors_mutex);
          errors.push_back("thread " + std::to_string(t) + ": " + e.what());
        }
      });
    }
    for (auto& th : threads) th.join();
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();

    Counts total;
    for (const auto& w : workers) {
      for (int op = 0; op < kNumOps; ++op) total.ops[op] += w->counts().ops[op];
      total.wrong += w->counts().wrong;
      total.iterations += w->counts().iterations;
      if (total.first_wrong.empty()) total.first_wrong = w->counts().first_wrong;
    }
    for (const auto& e : errors) std::cerr << "bench_soak: rank " << rank << " " << e << "\n";
    std::cout << "rank " << rank << ": " << total.iterations << " iterations on " << threads.size()
              << " group(s) in " << elapsed << " s;";
    for (int op = 0; op < kNumOps; ++op) std::cout << " " << kOpNames[op] << "=" << total.ops[op];
    std::cout << "; wrong=" << total.wrong << "; failed threads=" << errors.size()
              << (total.first_wrong.empty() ? "" : "; first wrong: " + total.first_wrong)
              << std::endl;
    if (!errors.empty()) return 1;  // a broken group cannot take part in the summary

    // Totals over ranks (each collective counted once per participating rank).
    at::Tensor sums = torch::zeros({kNumOps + 2}, torch::kLong);
    for (int op = 0; op < kNumOps; ++op) sums[op] = total.ops[op];
    sums[kNumOps] = total.wrong;
    sums[kNumOps + 1] = total.iterations;
    tdist::all_reduce(sums);
    if (rank == 0) {
      std::cout << "soak: world " << world << ", " << args.threads << " threads/groups, "
                << args.seconds << " s, max numel " << args.max_numel << ": "
                << sums[kNumOps + 1].item<int64_t>() << " rank-iterations;";
      for (int op = 0; op < kNumOps; ++op) {
        std::cout << " " << kOpNames[op] << "=" << sums[op].item<int64_t>();
      }
      std::cout << "; wrong=" << sums[kNumOps].item<int64_t>() << std::endl;
    }
    const bool ok = sums[kNumOps].item<int64_t>() == 0;
    tdist::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "bench_soak: rank " << rank << ": error: " << e.what() << "\n";
    return 1;
  }
}

// nccl-tests-style table for tdist's Gloo engine and, beside it, PyTorch's c10d
// ProcessGroupGloo: op, bytes, time, algbw, busbw and #wrong (each size is verified after it
// is timed). The parent process spawns `--world` copies of itself on loopback, then `--world`
// Python ranks of the same PyTorch release (c10d_collectives.py: same sizes, iterations,
// rounds and checks), and prints both side by side. c10d is driven from Python because its
// C++ header needs the Gloo headers of LibTorch's own Gloo, which no package ships
// (docs/gloo.md, "One Gloo per symbol scope").
//
//   bench_collectives [--world 2] [--min-bytes 1024] [--max-bytes 268435456] [--step 4]
//                     [--ops all_reduce,all_gather_into_tensor,...] [--no-c10d] [--no-symm]
//                     [--mpi] [--mpi-bind core|none|...] [--rounds 3]
//
// The symm column is tdist's Gloo engine on tensors in symmetric memory
// (tdist::symmetric_memory::empty; all_reduce, all_gather_into_tensor, reduce_scatter_tensor),
// where peers read each other's tensors without staging copies; symm_x = its busbw / c10d's.
//
// Each size is timed in --rounds rounds of back-to-back iterations; a round's time is the mean
// per iteration, the slowest rank's; the table shows the best round, for every implementation
// alike (the machine is shared, and one descheduled rank stalls a whole round).
//
// --mpi: the ranks are started with mpirun instead, and the table is tdist's MPI backend
// beside tdist's Gloo engine and beside memcpy bandwidth (every rank copying `bytes` at once),
// timed in turns round by round (Note [Interleaved rounds]); BENCH_TRACE=1 prints every
// round. Its msym columns are the MPI backend on tensors in symmetric memory
// (all_reduce, all_gather_into_tensor, reduce_scatter_tensor; --no-symm skips them); its mpi
// columns are plain tensors, which the backend reads across processes inside a size window
// (Note [Plain tensors read across processes], src/mpi/shm_collectives.h; TDIST_MPI_SHM_CMA=0
// stages them all). Placement: mpirun's (Note [MPI binding]), or --mpi-bind.

#include <sys/types.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tdist/comm/symmetric_memory.h"
#include "tdist/gloo/gloo_backend.h"
#ifdef TDIST_HAVE_MPI
#include "tdist/mpi/mpi_backend.h"
#endif
#include "tdist/store/file_store.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int world = 2;
  int64_t min_bytes = 1024;
  int64_t max_bytes = int64_t(256) << 20;
  int step = 4;
  std::vector<std::string> ops = {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                                  "broadcast", "all_to_all_single"};
  bool c10d = true;
  bool mpi = false;
  bool symmetric = true;  // --no-symm: skip the symmetric-memory column
  int rounds = 3;
  std::string mpi_bind;  // --mpi-bind: mpirun's --bind-to (default: mpirun's policy)
};

int g_rounds = 3;      // --rounds, read by measure()
bool g_trace = false;  // BENCH_TRACE=1: every round's times (--mpi)

// Bus bandwidth factor (nccl-tests' PERFORMANCE.md): what each rank's link must carry.
double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return double(n - 1) / n;
}

// One implementation under test. `bytes` is the nccl-tests size: the whole buffer for
// all_reduce/broadcast/all_to_all, the output for all_gather, the input for reduce_scatter.
struct Impl {
  virtual ~Impl() = default;
  virtual std::string name() const = 0;
  virtual bool has(const std::string& op) const = 0;
  virtual void run(const std::string& op, at::Tensor& in, at::Tensor& out) = 0;
  /// Where the tensors under test live.
  virtual at::Tensor alloc(int64_t numel) { return torch::empty({numel}); }
};

struct TdistImpl : Impl {
  std::shared_ptr<tdist::CollectiveBackend> b;
  std::string label = "tdist";
  // Tensors in symmetric memory (tdist::symmetric_memory::empty): no staging copies for the
  // ops that have a symmetric path.
  bool symmetric = false;
  std::string name() const override { return label; }
  bool has(const std::string& op) const override {
    return !symmetric || op == "all_reduce" || op == "all_gather_into_tensor" ||
           op == "reduce_scatter_tensor";
  }
  at::Tensor alloc(int64_t numel) override {
    return symmetric ? tdist::symmetric_memory::empty({numel}, torch::kFloat) : Impl::alloc(numel);
  }
  void run(const std::string& op, at::Tensor& in, at::Tensor& out) override {
    if (op == "all_reduce") {
      b->all_reduce(in, {})->wait();
    } else if (op == "all_gather_into_tensor") {
      b->all_gather_into_tensor(out, in, {})->wait();
    } else if (op == "reduce_scatter_tensor") {
      b->reduce_scatter_tensor(out, in, {})->wait();
    } else if (op == "broadcast") {
      b->broadcast(in, {})->wait();
    } else {
      b->all_to_all_single(out, in, {}, {}, {})->wait();
    }
  }
};

// Fills inputs with known values, runs once, returns the number of wrong elements.
int64_t verify(Impl& impl, const std::string& op, at::Tensor& in, at::Tensor& out, int rank,
               int n) {
  const double tri = n * (n + 1) / 2.0;
  at::Tensor want;
  if (op == "all_reduce") {
    in.fill_(rank + 1);
    impl.run(op, in, out);
    return (in != tri).sum().item<int64_t>();
  }
  if (op == "broadcast") {
    in.fill_(rank + 1);
    impl.run(op, in, out);
    return (in != 1).sum().item<int64_t>();
  }
  if (op == "all_gather_into_tensor") {
    in.fill_(rank + 1);
    out.zero_();
    impl.run(op, in, out);
    want = torch::arange(1, n + 1, torch::kFloat).repeat_interleave(in.numel());
  } else if (op == "reduce_scatter_tensor") {
    in.copy_(torch::arange(1, n + 1, torch::kFloat).repeat_interleave(out.numel()) * (rank + 1));
    impl.run(op, in, out);
    want = torch::full_like(out, (rank + 1) * tri);
  } else {
    const int64_t block = in.numel() / n;
    in.copy_(torch::arange(n, torch::kFloat).repeat_interleave(block) + 100 * rank);
    out.zero_();
    impl.run(op, in, out);
    want = torch::arange(n, torch::kFloat).repeat_interleave(block) * 100 + rank;
  }
  return (out != want).sum().item<int64_t>();
}

struct Result {
  double time_us = 0;
  int64_t wrong = 0;
  bool ran = false;
};

int iterations_for(int64_t bytes) {
  return static_cast<int>(
      std::max<int64_t>(3, std::min<int64_t>(50, (int64_t(512) << 20) / bytes)));
}

// One timed round: `iters` back-to-back calls of `body`; the slowest rank's mean per call, us.
double time_round(tdist::CollectiveBackend& sync, int iters, const std::function<void()>& body) {
  sync.barrier({})->wait();
  auto start = Clock::now();
  for (int i = 0; i < iters; ++i) body();
  double local = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
  at::Tensor t = torch::tensor({local}, torch::kDouble);
  tdist::AllreduceOptions max;
  max.op = tdist::ReduceOp::MAX;
  sync.all_reduce(t, max)->wait();
  return t.item<double>();
}

// One op of one implementation at one size: its tensors, timed round by round, so that
// several of them can be interleaved (Note [Interleaved rounds]).
class Measurement {
 public:
  Measurement(Impl& impl, const std::string& op, int64_t bytes, int n)
      : impl_(impl), op_(op), iters_(iterations_for(bytes)) {
    if (!impl.has(op)) return;
    const int64_t numel = bytes / 4 / n * n;  // every rank's chunk equal (world 3)
    if (op == "all_gather_into_tensor") {
      in_ = impl.alloc(numel / n);
      out_ = impl.alloc(numel);
    } else if (op == "reduce_scatter_tensor") {
      in_ = impl.alloc(numel);
      out_ = impl.alloc(numel / n);
    } else {
      in_ = impl.alloc(numel);
      out_ = impl.alloc(numel);
    }
    in_.fill_(1);
    impl.run(op, in_, out_);  // warm-up
    result_.time_us = INFINITY;
    result_.ran = true;
  }
  bool ran() const { return result_.ran; }
  /// Times one round; returns its time (us), or NaN when the implementation lacks the op.
  double round(tdist::CollectiveBackend& sync) {
    if (!ran()) return NAN;
    const double us = time_round(sync, iters_, [&] { impl_.run(op_, in_, out_); });
    result_.time_us = std::min(result_.time_us, us);
    return us;
  }
  /// Verifies the op once (after timing) and returns the best round.
  Result finish(tdist::CollectiveBackend& sync, int rank, int n) {
    if (!ran()) return result_;
    at::Tensor wrong = torch::tensor({verify(impl_, op_, in_, out_, rank, n)}, torch::kLong);
    sync.all_reduce(wrong, {})->wait();
    result_.wrong = wrong.item<int64_t>();
    return result_;
  }

 private:
  Impl& impl_;
  std::string op_;
  int iters_;
  at::Tensor in_, out_;
  Result result_;
};

Result measure(Impl& impl, tdist::CollectiveBackend& sync, const std::string& op, int64_t bytes,
               int rank, int n) {
  Measurement m(impl, op, bytes, n);
  for (int round = 0; round < g_rounds; ++round) m.round(sync);
  return m.finish(sync, rank, n);
}

// Untimed rounds of `op` at the sweep's first size before any timed size: the first calls of
// an op pay for connections, segments and first touches of memory, which made the first row
// of a sweep read several times slower than the same size in a rerun.
void warm_up(Impl& impl, tdist::CollectiveBackend& sync, const std::string& op, int64_t bytes,
             int n) {
  constexpr int kWarmUpRounds = 3;
  Measurement m(impl, op, bytes, n);
  for (int round = 0; round < kWarmUpRounds; ++round) m.round(sync);
}

int child(const Config& cfg, int rank, const std::string& dir) {
  const int n = cfg.world;
  auto store =
      std::make_shared<tdist::FileStore>(dir + "/tdist_store", -1, std::chrono::seconds(60));
  auto options = tdist::gloo::gloo_options_from_env();
  if (options.interfaces().empty()) options.hostname("127.0.0.1");
  TdistImpl mine;
  mine.b = std::make_shared<tdist::gloo::GlooBackend>(store, rank, n, std::chrono::seconds(300),
                                                      options);
  TdistImpl symm;
  symm.b = mine.b;
  symm.symmetric = cfg.symmetric && options.shared_memory();
  std::ofstream rows;
  if (rank == 0) rows.open(dir + "/tdist.tsv");
  int64_t wrong = 0;
  for (const auto& op : cfg.ops) {
    warm_up(mine, *mine.b, op, cfg.min_bytes, n);
    if (symm.symmetric) warm_up(symm, *mine.b, op, cfg.min_bytes, n);
    for (int64_t bytes = cfg.min_bytes; bytes <= cfg.max_bytes; bytes *= cfg.step) {
      Result a = measure(mine, *mine.b, op, bytes, rank, n);
      Result y;
      if (symm.symmetric) y = measure(symm, *mine.b, op, bytes, rank, n);
      wrong += a.wrong + y.wrong;  // already summed over ranks
      if (rank != 0) continue;
      rows << op << '\t' << bytes << '\t' << a.time_us << '\t' << a.wrong << '\t';
      if (y.ran) {
        rows << y.time_us << '\t' << y.wrong << '\n';
      } else {
        rows << "n/a\tn/a\n";
      }
      rows.flush();
    }
  }
  mine.b->barrier({})->wait();
  return wrong == 0 ? 0 : 1;
}

// Every rank copies `bytes` at once, like the ranks of a collective share the memory bus;
// timed round by round like a Measurement. gbs() is the slowest rank's best round, in GB/s.
class MemcpyMeasurement {
 public:
  explicit MemcpyMeasurement(int64_t bytes)
      : bytes_(bytes), iters_(iterations_for(bytes)), a_(bytes, 1), b_(bytes, 2) {
    std::memcpy(b_.data(), a_.data(), bytes);
  }
  double round(tdist::CollectiveBackend& sync) {
    int i = 0;
    const double us = time_round(sync, iters_, [&] {
      std::memcpy(i % 2 ? a_.data() : b_.data(), i % 2 ? b_.data() : a_.data(), bytes_);
      ++i;
    });
    best_us_ = std::min(best_us_, us);
    return us;
  }
  double gbs() const { return bytes_ / (best_us_ * 1e3); }

 private:
  int64_t bytes_;
  int iters_;
  std::vector<char> a_, b_;
  double best_us_ = INFINITY;
};

#ifdef TDIST_HAVE_MPI
// Under mpirun: tdist's MPI backend beside tdist's Gloo engine and memcpy.
int child_mpi(const Config& cfg, const std::string& dir) {
  const int rank = tdist::mpi::world_rank();
  const int n = tdist::mpi::world_size();
  auto store =
      std::make_shared<tdist::FileStore>(dir + "/tdist_store", -1, std::chrono::seconds(60));
  auto options = tdist::gloo::gloo_options_from_env();
  if (options.interfaces().empty()) options.hostname("127.0.0.1");
  TdistImpl gloo;
  gloo.b = std::make_shared<tdist::gloo::GlooBackend>(store, rank, n, std::chrono::seconds(300),
                                                      options);
  TdistImpl mpi;
  mpi.label = "mpi";
  mpi.b = std::make_shared<tdist::mpi::MPIBackend>(nullptr, rank, n, std::chrono::seconds(300));
  TdistImpl msym;
  msym.label = "mpi_symm";
  msym.b = mpi.b;
  msym.symmetric = cfg.symmetric && tdist::symmetric_memory::is_available();
  if (rank == 0) {
    std::printf(
        "# world %d, float32, one host; tdist MPI backend (mpirun) beside tdist Gloo "
        "(shared memory %s) and memcpy; times are the max over ranks\n",
        n, options.shared_memory() ? "on" : "off");
    std::printf("%-24s %12s | %10s %8s %8s %6s | %10s %8s %6s | %10s %8s %6s | %9s | %8s %8s %9s\n",
                "op", "bytes", "mpi_us", "algbw", "busbw", "#wrong", "msym_us", "busbw", "#wrong",
                "gloo_us", "busbw", "#wrong", "memcpy", "mpi/mcpy", "mpi/gloo", "msym/mcpy");
  }
  int64_t wrong = 0;
  for (const auto& op : cfg.ops) {
    warm_up(mpi, *gloo.b, op, cfg.min_bytes, n);
    warm_up(gloo, *gloo.b, op, cfg.min_bytes, n);
    if (msym.symmetric) warm_up(msym, *gloo.b, op, cfg.min_bytes, n);
    for (int64_t bytes = cfg.min_bytes; bytes <= cfg.max_bytes; bytes *= cfg.step) {
      // Note [Interleaved rounds]: the MPI op, the Gloo op and memcpy take turns round by
      // round, so each ratio compares them under the same conditions (this machine's memory
      // bandwidth moves 2x from minute to minute; timing each one's rounds back to back
      // compared a slow minute of one with a fast minute of another).
      Measurement mm(mpi, op, bytes, n), gm(gloo, op, bytes, n);
      std::optional<Measurement> sm;
      if (msym.symmetric) sm.emplace(msym, op, bytes, n);
      MemcpyMeasurement cm(bytes);
      for (int round = 0; round < g_rounds; ++round) {
        const double m_us = mm.round(*gloo.b);
        const double s_us = sm ? sm->round(*gloo.b) : NAN;
        const double g_us = gm.round(*gloo.b), c_us = cm.round(*gloo.b);
        if (g_trace && rank == 0) {
          std::printf(
              "# round %d %s %lld: mpi %.1f us, mpi_symm %.1f us, gloo %.1f us, memcpy %.1f us\n",
              round, op.c_str(), (long long)bytes, m_us, s_us, g_us, c_us);
        }
      }
      Result m = mm.finish(*gloo.b, rank, n), g = gm.finish(*gloo.b, rank, n);
      Result y = sm ? sm->finish(*gloo.b, rank, n) : Result();
      const double mem = cm.gbs();
      wrong += m.wrong + g.wrong + y.wrong;  // already summed over ranks
      if (rank != 0) continue;
      const double f = bus_factor(op, n);
      auto bus = [&](const Result& r) { return bytes / (r.time_us * 1e3) * f; };
      std::printf("%-24s %12lld | %10.1f %8.3f %8.3f %6lld | ", op.c_str(), (long long)bytes,
                  m.time_us, bytes / (m.time_us * 1e3), bus(m), (long long)m.wrong);
      if (y.ran) {
        std::printf("%10.1f %8.3f %6lld | ", y.time_us, bus(y), (long long)y.wrong);
      } else {
        std::printf("%10s %8s %6s | ", "n/a", "", "");
      }
      std::printf("%10.1f %8.3f %6lld | %9.3f | %7.1f%% %8.2f ", g.time_us, bus(g),
                  (long long)g.wrong, mem, 100.0 * bus(m) / mem, bus(m) / bus(g));
      if (y.ran) {
        std::printf("%8.1f%%\n", 100.0 * bus(y) / mem);
      } else {
        std::printf("%9s\n", "");
      }
      std::fflush(stdout);
    }
  }
  gloo.b->barrier({})->wait();
  mpi.b->barrier({})->wait();
  return wrong == 0 ? 0 : 1;
}
#endif

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

// Forks `world` ranks (BENCH_RANK, BENCH_DIR set) that each run `exec`; 0 when all exit 0.
int run_ranks(int world, const std::string& dir, const std::function<void()>& exec) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("BENCH_RANK", std::to_string(rank).c_str(), 1);
      setenv("BENCH_DIR", dir.c_str(), 1);
      exec();
      _exit(127);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}

// One row of a results file: op, bytes, then (time_us, wrong) pairs; "n/a" where not run.
struct Row {
  std::string op;
  int64_t bytes = 0;
  std::vector<Result> results;
};

std::map<std::pair<std::string, int64_t>, Row> read_rows(const std::string& path) {
  std::map<std::pair<std::string, int64_t>, Row> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::stringstream fields(line);
    Row row;
    std::string bytes, time, wrong;
    std::getline(fields, row.op, '\t');
    std::getline(fields, bytes, '\t');
    row.bytes = std::stoll(bytes);
    while (std::getline(fields, time, '\t') && std::getline(fields, wrong, '\t')) {
      Result r;
      r.ran = time != "n/a";
      if (r.ran) {
        r.time_us = std::stod(time);
        r.wrong = std::stoll(wrong);
      }
      row.results.push_back(r);
    }
    rows[{row.op, row.bytes}] = row;
  }
  return rows;
}

// tdist (plain, symmetric) beside c10d, from the ranks' result files; 1 on a wrong element.
int print_table(const Config& cfg, const std::string& dir) {
  const auto mine = read_rows(dir + "/tdist.tsv");
  const auto theirs = read_rows(dir + "/c10d.tsv");
  const auto options = tdist::gloo::gloo_options_from_env();
  std::printf(
      "# world %d, float32, loopback; tdist channels %d, segment %zu KiB; c10d: PyTorch %s's "
      "ProcessGroupGloo%s; times are the max over ranks of the mean per iteration, best of %d "
      "rounds\n",
      cfg.world, options.channels(), options.segment_bytes() >> 10, TORCH_VERSION,
      theirs.empty() ? " (not run)" : "", cfg.rounds);
  std::printf("%-24s %12s | %10s %8s %8s %6s | %10s %8s %6s | %10s %8s %8s %6s | %7s %7s\n", "op",
              "bytes", "tdist_us", "algbw", "busbw", "#wrong", "symm_us", "busbw", "#wrong",
              "c10d_us", "algbw", "busbw", "#wrong", "busbw_x", "symm_x");
  int64_t wrong = 0;
  for (const auto& op : cfg.ops) {
    for (int64_t bytes = cfg.min_bytes; bytes <= cfg.max_bytes; bytes *= cfg.step) {
      auto it = mine.find({op, bytes});
      if (it == mine.end() || it->second.results.size() < 2) {
        std::printf("%-24s %12lld | missing\n", op.c_str(), (long long)bytes);
        wrong += 1;
        continue;
      }
      const Result a = it->second.results[0], y = it->second.results[1];
      auto jt = theirs.find({op, bytes});
      const Result b =
          jt == theirs.end() || jt->second.results.empty() ? Result() : jt->second.results[0];
      wrong += a.wrong + y.wrong + b.wrong;
      const double f = bus_factor(op, cfg.world);
      auto alg = [&](const Result& r) { return bytes / (r.time_us * 1e3); };  // GB/s
      std::printf("%-24s %12lld | %10.1f %8.3f %8.3f %6lld | ", op.c_str(), (long long)bytes,
                  a.time_us, alg(a), alg(a) * f, (long long)a.wrong);
      if (y.ran) {
        std::printf("%10.1f %8.3f %6lld | ", y.time_us, alg(y) * f, (long long)y.wrong);
      } else {
        std::printf("%10s %8s %6s | ", "n/a", "", "");
      }
      if (b.ran) {
        std::printf("%10.1f %8.3f %8.3f %6lld | %7.2f ", b.time_us, alg(b), alg(b) * f,
                    (long long)b.wrong, b.time_us / a.time_us);
        if (y.ran) {
          std::printf("%7.2f\n", b.time_us / y.time_us);
        } else {
          std::printf("%7s\n", "");
        }
      } else {
        std::printf("%10s %8s %8s %6s | %7s %7s\n", "n/a", "", "", "", "", "");
      }
    }
  }
  std::fflush(stdout);
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--world") {
      cfg.world = std::stoi(next());
    } else if (a == "--min-bytes") {
      cfg.min_bytes = std::stoll(next());
    } else if (a == "--max-bytes") {
      cfg.max_bytes = std::stoll(next());
    } else if (a == "--step") {
      cfg.step = std::stoi(next());
    } else if (a == "--ops") {
      cfg.ops = split(next());
    } else if (a == "--no-c10d") {
      cfg.c10d = false;
    } else if (a == "--no-symm") {
      cfg.symmetric = false;
    } else if (a == "--mpi") {
      cfg.mpi = true;
    } else if (a == "--mpi-bind") {
      cfg.mpi_bind = next();
    } else if (a == "--rounds") {
      cfg.rounds = std::max(1, std::stoi(next()));
    } else {
      std::cerr << "usage: " << argv[0]
                << " [--world N] [--min-bytes B] [--max-bytes B] [--step K] [--ops a,b]"
                   " [--no-c10d] [--no-symm] [--mpi] [--mpi-bind POLICY] [--rounds R]\n  env: "
                   "TDIST_GLOO_CHANNELS, "
                   "TDIST_GLOO_SHM, "
                   "GLOO_SOCKET_IFNAME\n";
      return a == "--help" ? 0 : 2;
    }
  }
  g_rounds = cfg.rounds;
  g_trace = std::getenv("BENCH_TRACE") != nullptr;
  if (const char* r = std::getenv("BENCH_RANK")) {
    return child(cfg, std::atoi(r), std::getenv("BENCH_DIR"));
  }
#ifdef TDIST_HAVE_MPI
  if (cfg.mpi && tdist::mpi::launched_by_mpirun()) return child_mpi(cfg, std::getenv("BENCH_DIR"));
#else
  if (cfg.mpi) {
    std::cerr << "--mpi: this build has no MPI backend (install libopenmpi-dev, reconfigure)\n";
    return 2;
  }
#endif
  char tmpl[] = "/tmp/tdist-bench-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  if (cfg.mpi) {
    setenv("BENCH_DIR", dir.c_str(), 1);
    setenv("OMP_NUM_THREADS", "1", 0);
    // Note [MPI binding]: mpirun's own placement policy unless --mpi-bind says otherwise: a
    // core per rank while ranks <= cores, none when oversubscribed (what `mpirun -n N` does
    // for a user). `--mpi-bind none` lets the scheduler place them: on 2 vCPUs it then puts
    // both ranks on one vCPU for milliseconds at a time (traced with sched_getcpu), and
    // every op waits out the other rank's time slice (1 MiB ops 3x slower for whole rounds).
    std::string cmd = "mpirun -n " + std::to_string(cfg.world) +
                      " --oversubscribe --allow-run-as-root --mca btl self,vader" +
                      (cfg.mpi_bind.empty() ? "" : " --bind-to " + cfg.mpi_bind) +
                      " -x BENCH_DIR -x OMP_NUM_THREADS " +
                      std::filesystem::read_symlink("/proc/self/exe").string();
    for (int i = 1; i < argc; ++i) cmd += std::string(" '") + argv[i] + "'";
    int rc = std::system(cmd.c_str());
    std::system(("rm -rf '" + dir + "'").c_str());
    return rc == 0 ? 0 : 1;
  }
  int rc = run_ranks(cfg.world, dir, [&] {
    execv("/proc/self/exe", argv);
    std::perror("execv");
  });
  if (rc == 0 && cfg.c10d) {
    const std::string python =
        std::getenv("TDIST_PYTHON") ? std::getenv("TDIST_PYTHON") : TDIST_PYTHON;
    std::vector<std::string> args = {
        python,        TDIST_BENCH_C10D_PY,           "--world",     std::to_string(cfg.world),
        "--min-bytes", std::to_string(cfg.min_bytes), "--max-bytes", std::to_string(cfg.max_bytes),
        "--step",      std::to_string(cfg.step),      "--ops",       join(cfg.ops),
        "--rounds",    std::to_string(cfg.rounds)};
    if (run_ranks(cfg.world, dir, [&] {
          std::vector<char*> cargs;
          for (auto& a : args) cargs.push_back(a.data());
          cargs.push_back(nullptr);
          execv(python.c_str(), cargs.data());
          std::perror(("execv " + python).c_str());
        }) != 0) {
      std::fprintf(stderr, "bench_collectives: the c10d side (%s) failed; its columns are n/a\n",
                   TDIST_BENCH_C10D_PY);
    }
  }
  if (rc == 0) rc = print_table(cfg, dir);
  std::system(("rm -rf '" + dir + "'").c_str());
  return rc;
}

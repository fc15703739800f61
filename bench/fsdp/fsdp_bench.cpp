// FSDP benchmark, world 2, one run, side by side: single process; tdist DDP; FSDP full shard
// (ZeRO-3); FSDP reshard_after_forward=false (ZeRO-2); FSDP full shard without prefetch.
// The distributed modes run in turns, BENCH_ROUNDS (default 3) times each (Note [Modes in
// turns]). Per mode: step time (best step over the rounds; med_ms: the median of the rounds'
// median steps) and their ratios to DDP, peak RSS per rank, model-state
// bytes per rank against 16*psi/N, and per FSDP module per step the hooks' time split as
// Note [Hook time accounting] (src/fsdp/hook_timing.h) says: copy_ms/mod (data movement into
// and out of collective buffers), fsdp_us/mod (the framework's own bookkeeping),
// issue_us/mod (handing collectives to the backend), each the best step's total over the
// modules divided by their number; wait_ms is the mean time per step blocked on collectives
// (all modules). A #wrong
// column: the final loss must match the single-process run (which trains on both ranks'
// batches). Env: BENCH_WIDTH, BENCH_DEPTH, BENCH_BATCH (per rank), BENCH_SEQ, BENCH_VOCAB,
// BENCH_STEPS, BENCH_WARMUP, BENCH_THREADS, BENCH_MODES (comma list), BENCH_ROUNDS,
// BENCH_BACKEND (gloo, the default, or mpi: each mode's ranks started by one mpirun with
// mpirun's own placement, Note [MPI binding] in bench/collectives).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <unordered_set>

#include <torch/torch.h>

#include "bench_gpt.h"
#include "common/free_port.h"
#include "common/openblas_kernels.h"
#include "tdist/comm/distributed.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/models/pretrained.h"
#include "tdist/optim/adam.h"

namespace {

using bench_fsdp::DDP;
using bench_fsdp::env_int;
using bench_fsdp::GPT;
using bench_fsdp::train_step;

struct Config {
  int width = env_int("BENCH_WIDTH", 256);
  int depth = env_int("BENCH_DEPTH", 4);
  int heads = 4;
  int seq = env_int("BENCH_SEQ", 64);
  int vocab = env_int("BENCH_VOCAB", 1024);
  int batch = env_int("BENCH_BATCH", 8);  // per rank
  int steps = env_int("BENCH_STEPS", 10);
  int warmup = env_int("BENCH_WARMUP", 2);
  int threads = env_int("BENCH_THREADS", 1);
  int rounds = std::max(1, env_int("BENCH_ROUNDS", 3));
  bench_fsdp::GPTConfig gpt() const {
    bench_fsdp::GPTConfig g;
    g.width = width;
    g.depth = depth;
    g.heads = heads;
    g.seq = seq;
    g.vocab = vocab;
    return g;
  }
};

struct Result {
  double step_ms = NAN;
  double median_ms = NAN;  // the median step
  double final_loss = NAN;
  double state_bytes = NAN;  // params + grads + optimizer state, distinct storages
  double peak_rss_mb = NAN;
  double hook_us_per_module_step = NAN;   // framework bookkeeping (FSDPStats::hook_cpu_ns)
  double copy_ms_per_module_step = NAN;   // data movement (FSDPStats::copy_ns)
  double issue_us_per_module_step = NAN;  // issuing collectives (FSDPStats::comm_issue_ns)
  double wait_ms_per_step = NAN;
  double psi = NAN;
};

size_t unique_bytes(const std::vector<at::Tensor>& ts, std::unordered_set<const void*>& seen) {
  size_t total = 0;
  for (const auto& t : ts) {
    if (t.defined() && seen.insert(t.storage().unsafeGetStorageImpl()).second) {
      total += t.storage().nbytes();
    }
  }
  return total;
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

// Trains; `rank`/`world` pick this rank's rows of each global batch (world 1: all rows).
Result train(const Config& c, const std::string& mode, int rank, int world) {
  Result r;
  r.psi = static_cast<double>(c.gpt().model().num_parameters());
  std::vector<tdist::fsdp::FSDPModule> handles;
  GPT model = bench_fsdp::build_gpt(c.gpt(), [&](const GPT& m) {
    if (mode.rfind("fsdp", 0) != 0) return;
    tdist::fsdp::FullyShardOptions o;
    if (mode == "fsdp_zero2") o.reshard_after_forward(false);
    if (mode == "fsdp_noprefetch") o.prefetch(false);
    for (const auto& layer : m->layers()) handles.push_back(tdist::fsdp::fully_shard(layer, o));
    handles.push_back(tdist::fsdp::fully_shard(m, o));
  });
  std::unique_ptr<DDP> ddp;
#ifdef TDIST_BENCH_HAVE_DDP
  if (mode == "ddp") ddp = std::make_unique<DDP>(model);
#endif
  tdist::optim::AdamW opt(model->parameters(), tdist::optim::AdamWOptions(1e-3).implementation(
                                                   tdist::optim::Implementation::kFused));
  double best = INFINITY;
  // Per-module columns: the best step, like step_ms (a step whose hooks were preempted on
  // the shared 2-core machine reads high; the best one is the framework's real cost).
  struct Totals {
    double hook = 0, copy = 0, issue = 0;
  };
  auto totals = [&] {
    Totals t;
    for (auto& h : handles) {
      t.hook += static_cast<double>(h.stats().hook_cpu_ns);
      t.copy += static_cast<double>(h.stats().copy_ns);
      t.issue += static_cast<double>(h.stats().comm_issue_ns);
    }
    return t;
  };
  Totals best_module_step{INFINITY, INFINITY, INFINITY};
  std::vector<double> step_times;
  Totals before;
  const int64_t global = static_cast<int64_t>(c.batch) * (world == 1 ? 2 : world);
  for (int step = 0; step < c.warmup + c.steps; ++step) {
    if (step == c.warmup) {
      for (auto& h : handles) h.reset_stats();
    }
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + step));
    auto tokens = torch::randint(c.vocab, {global, c.seq + 1}, gen, torch::kLong);
    auto x = tokens.narrow(1, 0, c.seq), y = tokens.narrow(1, 1, c.seq);
    if (world > 1) {
      x = x.narrow(0, rank * c.batch, c.batch);
      y = y.narrow(0, rank * c.batch, c.batch);
    }
    before = totals();
    const auto t0 = std::chrono::steady_clock::now();
    auto loss = train_step(model, ddp.get(), opt, x, y, c.vocab);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (step >= c.warmup) {
      best = std::min(best, ms);
      step_times.push_back(ms);
      const Totals after = totals();
      best_module_step.hook = std::min(best_module_step.hook, after.hook - before.hook);
      best_module_step.copy = std::min(best_module_step.copy, after.copy - before.copy);
      best_module_step.issue = std::min(best_module_step.issue, after.issue - before.issue);
    }
    double l = loss.item<double>();
    if (world > 1) {
      auto t = torch::tensor({l}, torch::kFloat64);
      tdist::all_reduce(t);
      l = t.item<double>() / world;
    }
    r.final_loss = l;
  }
  r.step_ms = best;
  r.median_ms = median(step_times);
  std::unordered_set<const void*> seen;
  std::vector<at::Tensor> params, grads, states;
  for (const auto& p : model->parameters()) {
    params.push_back(p);
    grads.push_back(p.grad());
  }
  for (const auto& kv : opt.state()) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(*kv.second);
    states.push_back(s.exp_avg());
    states.push_back(s.exp_avg_sq());
  }
  r.state_bytes = static_cast<double>(unique_bytes(params, seen) + unique_bytes(grads, seen) +
                                      unique_bytes(states, seen));
  r.peak_rss_mb = peak_rss_mb();
  if (!handles.empty()) {
    double wait_ns = 0;
    for (auto& h : handles) wait_ns += static_cast<double>(h.stats().wait_ns);
    const double modules = static_cast<double>(handles.size());
    r.hook_us_per_module_step = best_module_step.hook / 1e3 / modules;
    r.copy_ms_per_module_step = best_module_step.copy / 1e6 / modules;
    r.issue_us_per_module_step = best_module_step.issue / 1e3 / modules;
    r.wait_ms_per_step = wait_ns / 1e6 / c.steps;
  }
  return r;
}

void write_result(const Result& r, const char* path) {
  std::ofstream out(path);
  out << std::setprecision(17) << r.step_ms << " " << r.median_ms << " " << r.final_loss << " "
      << r.state_bytes << " " << r.peak_rss_mb << " " << r.hook_us_per_module_step << " "
      << r.copy_ms_per_module_step << " " << r.issue_us_per_module_step << " " << r.wait_ms_per_step
      << " " << r.psi << "\n";
}

// Fields may be "nan" (e.g. a DDP rank has no FSDP hook time), which operator>> rejects.
bool read_result(const std::string& path, Result& r) {
  std::ifstream in(path);
  double* fields[] = {&r.step_ms,
                      &r.median_ms,
                      &r.final_loss,
                      &r.state_bytes,
                      &r.peak_rss_mb,
                      &r.hook_us_per_module_step,
                      &r.copy_ms_per_module_step,
                      &r.issue_us_per_module_step,
                      &r.wait_ms_per_step,
                      &r.psi};
  for (double* field : fields) {
    std::string token;
    if (!(in >> token)) return false;
    char* end = nullptr;
    *field = std::strtod(token.c_str(), &end);
    if (end == token.c_str() || *end != '\0') return false;
  }
  return true;
}

std::string backend_name() {
  const char* b = std::getenv("BENCH_BACKEND");
  const std::string name = b && *b ? b : "gloo";
  if (name != "gloo" && name != "mpi") {
    std::cerr << "BENCH_BACKEND must be gloo or mpi, got '" << name << "'\n";
    std::exit(2);
  }
  return name;
}

// The ranks of one mode as one mpirun job; rank r writes `prefix` + r.
std::vector<pid_t> start_mpirun(const std::string& self, const std::string& mode, int world,
                                const std::string& prefix) {
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("BENCH_ROLE", "rank", 1);
    setenv("BENCH_MODE", mode.c_str(), 1);
    setenv("BENCH_RESULT", prefix.c_str(), 1);
    const std::string n = std::to_string(world);
    execlp("mpirun", "mpirun", "-n", n.c_str(), "--oversubscribe", "--allow-run-as-root", "--mca",
           "btl", "self,vader", "-x", "BENCH_ROLE", "-x", "BENCH_MODE", "-x", "BENCH_RESULT",
           self.c_str(), static_cast<char*>(nullptr));
    std::perror("execlp mpirun");
    _exit(127);
  }
  return {pid};
}

// Runs this binary as `world` ranks of `mode`; returns each rank's result.
std::vector<Result> run_ranks(const std::string& self, const std::string& mode, int world) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("bench_fsdp_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const int port = bench::free_port();
  std::vector<pid_t> pids;
  std::vector<std::string> files;
  const bool mpi = backend_name() == "mpi";
  for (int rank = 0; rank < world; ++rank) {
    files.push_back((dir / (mode + std::to_string(rank))).string());
    std::filesystem::remove(files.back());
  }
  if (mpi) pids = start_mpirun(self, mode, world, (dir / mode).string());
  for (int rank = 0; rank < world && !mpi; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("BENCH_ROLE", "rank", 1);
      setenv("BENCH_MODE", mode.c_str(), 1);
      setenv("BENCH_RESULT", files[rank].c_str(), 1);
      execl(self.c_str(), self.c_str(), static_cast<char*>(nullptr));
      std::perror("execl");
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<int> statuses;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    statuses.push_back(status);
  }
  std::vector<Result> results;
  for (size_t i = 0; i < files.size(); ++i) {
    const int status = statuses[mpi ? 0 : i];
    Result r;
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) || !read_result(files[i], r)) {
      std::cerr << mode << " rank " << i << " failed (status " << status << ")\n";
      r = Result();
    }
    results.push_back(r);
  }
  return results;
}

}  // namespace

int main(int, char** argv) {
  bench_common::restart_with_openblas_kernels(argv);
  const Config c;
  torch::set_num_threads(c.threads);
  if (const char* role = std::getenv("BENCH_ROLE"); role && std::string(role) == "rank") {
    const std::string backend = backend_name();
    tdist::init_process_group(tdist::InitProcessGroupOptions().backend(backend));
    const Result r =
        train(c, std::getenv("BENCH_MODE"), tdist::get_rank(), tdist::get_world_size());
    std::string file = std::getenv("BENCH_RESULT");
    if (backend == "mpi") file += std::to_string(tdist::get_rank());  // one mpirun, one prefix
    write_result(r, file.c_str());
    tdist::destroy_process_group();
    return 0;
  }
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  std::vector<std::string> modes = {"ddp", "fsdp_full", "fsdp_zero2", "fsdp_noprefetch"};
#ifndef TDIST_BENCH_HAVE_DDP
  modes.erase(modes.begin());
#endif
  if (const char* m = std::getenv("BENCH_MODES")) {
    modes.clear();
    std::stringstream ss(m);
    for (std::string s; std::getline(ss, s, ',');) modes.push_back(s);
  }
  std::cout << "GPT width " << c.width << " depth " << c.depth << " seq " << c.seq << " vocab "
            << c.vocab << " batch/rank " << c.batch << " threads/rank " << c.threads << " steps "
            << c.steps << " backend " << backend_name() << "\n";
  const Result single = train(c, "single", 0, 1);
  const double psi = single.psi;
  std::cout << "psi = " << psi << " parameters, 16*psi = " << 16 * psi / 1e6
            << " MB, 16*psi/2 = " << 8 * psi / 1e6 << " MB\n\n";
  // Note [Modes in turns]: each mode runs BENCH_ROUNDS times, the modes taking turns, so a
  // ratio never compares one mode's quiet minute with another's busy one (this VM's speed
  // moves by minutes: bench/memcpy/cross_core_copy.c). A mode's row: its best step over
  // every round, the median of its rounds' median steps, the largest memory, and the
  // per-module columns of its best round.
  std::map<std::string, Result> rows;  // rank 0's row; memory and step time: max over ranks
  std::map<std::string, std::vector<double>> medians;
  std::map<std::string, int> wrong;
  for (int round = 0; round < c.rounds; ++round) {
    for (const auto& mode : modes) {
      auto rs = run_ranks(self, mode, 2);
      Result r = rs[0];
      for (const auto& x : rs) {
        r.peak_rss_mb = std::max(r.peak_rss_mb, x.peak_rss_mb);
        r.state_bytes = std::max(r.state_bytes, x.state_bytes);
        r.step_ms = std::max(r.step_ms, x.step_ms);
        r.median_ms = std::max(r.median_ms, x.median_ms);
      }
      const bool ok = std::isfinite(r.final_loss) && std::abs(r.final_loss - single.final_loss) <=
                                                         1e-4 * std::abs(single.final_loss);
      wrong[mode] += ok ? 0 : 1;
      medians[mode].push_back(r.median_ms);
      auto it = rows.find(mode);
      if (it == rows.end()) {
        rows[mode] = r;
        continue;
      }
      Result& kept = it->second;
      const double peak = std::max(kept.peak_rss_mb, r.peak_rss_mb);
      const double state = std::max(kept.state_bytes, r.state_bytes);
      if (r.step_ms < kept.step_ms) kept = r;
      kept.peak_rss_mb = peak;
      kept.state_bytes = state;
    }
  }
  for (auto& [mode, r] : rows) r.median_ms = median(medians[mode]);
  const double ddp_ms = rows.count("ddp") ? rows["ddp"].step_ms : NAN;
  const double ddp_med = rows.count("ddp") ? rows["ddp"].median_ms : NAN;
  std::cout << "rounds " << c.rounds << " (modes in turns); step_ms: best step, med_ms: median\n";
  std::cout << std::left << std::setw(17) << "mode" << std::right << std::setw(10) << "step_ms"
            << std::setw(9) << "x_ddp" << std::setw(10) << "med_ms" << std::setw(9) << "x_ddp"
            << std::setw(12) << "state_MB" << std::setw(12) << "x_16psi/N" << std::setw(12)
            << "peakRSS_MB" << std::setw(13) << "copy_ms/mod" << std::setw(13) << "fsdp_us/mod"
            << std::setw(14) << "issue_us/mod" << std::setw(11) << "wait_ms" << std::setw(14)
            << "final_loss" << std::setw(8) << "#wrong"
            << "\n";
  auto print = [&](const std::string& name, const Result& r, int n, int w) {
    std::cout << std::left << std::setw(17) << name << std::right << std::fixed
              << std::setprecision(2) << std::setw(10) << r.step_ms << std::setw(9)
              << r.step_ms / ddp_ms << std::setw(10) << r.median_ms << std::setw(9)
              << r.median_ms / ddp_med << std::setw(12) << r.state_bytes / 1e6 << std::setw(12)
              << r.state_bytes / (16.0 * psi / n) << std::setw(12) << r.peak_rss_mb << std::setw(13)
              << r.copy_ms_per_module_step << std::setw(13) << r.hook_us_per_module_step
              << std::setw(14) << r.issue_us_per_module_step << std::setw(11) << r.wait_ms_per_step
              << std::setw(14) << std::setprecision(6) << r.final_loss << std::setw(8) << w << "\n";
  };
  print("single(2x batch)", single, 1, 0);
  for (const auto& mode : modes) print(mode, rows[mode], 2, wrong[mode]);  // #wrong: rounds
  int total_wrong = 0;
  for (auto& [m, w] : wrong) total_wrong += w;
  return total_wrong == 0 ? 0 : 1;
}

// bench_fsdp_1b: the point of FSDP. Two ranks train a GPT-2 of >= 1e9 parameters (default
// width 1536, 36 blocks: 1.022e9; many mid-size blocks keep FSDP's in-flight unsharded blocks
// small) for a few steps with FSDP full shard (AdamW, fp32), and the
// same model under tdist DDP, each rank under the same address-space cap (RLIMIT_AS, set in
// the rank before it builds anything). FSDP needs 16*psi/2 bytes of model state per rank plus
// a few unsharded blocks; DDP needs 16*psi per rank, so it runs out of memory.
//
//   bench_fsdp_1b [--cap-gib 11] [--modes fsdp,ddp] [--deadline-s 1200]
//   modes: fsdp (build-then-shard: built whole, then layer by layer), fsdp-meta (deferred
//          init: built on the meta device, then materialize), ddp
//   env: BENCH_WIDTH (1536) BENCH_DEPTH (36) BENCH_SEQ (32) BENCH_BATCH (1, per rank)
//        BENCH_VOCAB (1024) BENCH_STEPS (3) BENCH_PREFETCH (1; 0: no prefetch, 1 all-gather
//        in flight); TDIST_FSDP_SYMMETRIC defaults to 0 here (see the rank's set-up)
//
// Safety: the cap bounds what each rank maps beyond its libraries, so the two ranks together
// never hold more than 2 x cap; the run refuses to start unless MemAvailable exceeds that
// plus 1 GiB.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "bench_gpt.h"
#include "common/free_port.h"
#include "common/openblas_kernels.h"
#include "tdist/comm/distributed.h"
#include "tdist/fsdp/deferred_init.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/models/pretrained.h"
#include "tdist/optim/adam.h"

namespace {

using bench_fsdp::DDP;
using bench_fsdp::env_int;
using bench_fsdp::GPT;
using bench_fsdp::train_step;

// A /proc/self/status or /proc/meminfo field, in KiB (-1 if absent).
long proc_kib(const char* file, const char* field) {
  std::ifstream in(file);
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::atol(line.c_str() + n + 1);
    }
  }
  return -1;
}

double gib(double kib) {
  return kib / (1024.0 * 1024.0);
}

std::string memory_line() {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(2);
  s << "peak RSS " << gib(proc_kib("/proc/self/status", "VmHWM")) << " GiB, peak address space "
    << gib(proc_kib("/proc/self/status", "VmPeak")) << " GiB";
  return s.str();
}

void say(const std::string& who, const std::string& what) {
  std::ostringstream s;
  s << "[" << who << "] " << what << "\n";
  std::cout << s.str() << std::flush;
}

// One rank: builds the model and trains. fsdp: built whole, then each layer sharded
// (build-then-shard); fsdp-meta: built on the meta device, sharded, then materialize
// allocates and initialises this rank's shards only (deferred init, transformers' GPT-2
// initialisation); ddp: built whole.
int run_rank(const std::string& mode, int rank) {
  const std::string who = mode + " rank " + std::to_string(rank);
  bench_fsdp::GPTConfig g;
  g.width = env_int("BENCH_WIDTH", 1536);
  g.depth = env_int("BENCH_DEPTH", 36);
  g.heads = 16;
  g.seq = env_int("BENCH_SEQ", 32);
  g.vocab = env_int("BENCH_VOCAB", 1024);
  const int batch = env_int("BENCH_BATCH", 1);
  const int steps = env_int("BENCH_STEPS", 3);
  const bool deferred = mode == "fsdp-meta";
  const bool fsdp = mode == "fsdp" || deferred;
  // BENCH_PREFETCH=0: no prefetch and one all-gather in flight (fewer unsharded blocks alive).
  tdist::fsdp::FullyShardOptions options;
  if (env_int("BENCH_PREFETCH", 1) == 0) options.prefetch(false).all_gather_limit(1);
  try {
    torch::manual_seed(42);  // identical initial parameters on every rank
    const double rss_before_gib = gib(proc_kib("/proc/self/status", "VmRSS"));
    const auto t_build = std::chrono::steady_clock::now();
    const tdist::models::ModelConfig config = g.model();
    const double psi = static_cast<double>(config.num_parameters());
    GPT model;
    if (deferred) {
      model = bench_fsdp::build_gpt(
          g, [&](const GPT& m) { tdist::models::fully_shard_model(m, options); });
    } else {
      model = tdist::models::build_model(config);
      const auto init = tdist::models::init_weights_fn(config);
      torch::NoGradGuard no_grad;
      for (const auto& item : model->named_modules()) init(item.key(), *item.value());
      if (fsdp) tdist::models::fully_shard_model(model, options);
    }
    std::unique_ptr<DDP> ddp;
#ifdef TDIST_BENCH_HAVE_DDP
    if (!fsdp) ddp = std::make_unique<DDP>(model);
#else
    if (!fsdp) throw std::runtime_error("bench built without tdist_ddp");
#endif
    tdist::optim::AdamW opt(model->parameters(), tdist::optim::AdamWOptions(1e-4).implementation(
                                                     tdist::optim::Implementation::kFused));
    const double build_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_build).count();
    {
      std::ostringstream s;
      s.setf(std::ios::fixed);
      s.precision(2);
      s << "built " << psi / 1e9 << "e9 parameters in " << build_s << " s; RSS before building "
        << rss_before_gib << " GiB; " << memory_line();
      say(who, s.str());
    }
    for (int step = 0; step < steps; ++step) {
      auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + step));
      auto tokens = torch::randint(g.vocab, {2 * batch, g.seq + 1}, gen, torch::kLong);
      auto x = tokens.narrow(1, 0, g.seq).narrow(0, rank * batch, batch);
      auto y = tokens.narrow(1, 1, g.seq).narrow(0, rank * batch, batch);
      const auto t0 = std::chrono::steady_clock::now();
      auto loss = train_step(model, ddp.get(), opt, x, y, g.vocab);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      auto l = torch::tensor({loss.item<double>()}, torch::kFloat64);
      tdist::all_reduce(l);
      std::ostringstream out;
      out.setf(std::ios::fixed);
      out.precision(4);
      out << "step " << step << ": " << s << " s, loss (mean over ranks) " << l.item<double>() / 2
          << "; " << memory_line();
      say(who, out.str());
    }
    say(who, "OK");
    return 0;
  } catch (const std::bad_alloc& e) {
    say(who,
        std::string("FAILED, out of memory (std::bad_alloc): ") + e.what() + "; " + memory_line());
  } catch (const std::exception& e) {
    std::string what = e.what();
    const size_t nl = what.find('\n');  // c10::Error appends a backtrace
    if (nl != std::string::npos) what.resize(nl);
    say(who, "FAILED: " + what + "; " + memory_line());
  }
  return 3;
}

// Runs two ranks of `mode`; returns true if both finished OK.
bool run_mode(const std::string& self, const std::string& mode, long cap_bytes, int deadline_s) {
  const int port = bench::free_port();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("BENCH_ROLE", "rank", 1);
      setenv("BENCH_MODE", mode.c_str(), 1);
      setenv("BENCH_CAP_BYTES", std::to_string(cap_bytes).c_str(), 1);
      // Fewer malloc arenas: each reserves 64 MiB of address space, which RLIMIT_AS counts.
      setenv("MALLOC_ARENA_MAX", "2", 1);
      // FSDP's buffers in ordinary memory: in symmetric memory (the default) each rank also
      // maps its peer's flat shards and pooled blocks, and RLIMIT_AS counts those pages once
      // more in every rank that maps them (~2 GiB here), though no more physical memory is
      // used. The cap compares memory, so both modes keep their own pages only. Set
      // TDIST_FSDP_SYMMETRIC=1 to override.
      setenv("TDIST_FSDP_SYMMETRIC", "0", 0);
      execl(self.c_str(), self.c_str(), static_cast<char*>(nullptr));
      std::perror("execl");
      _exit(127);
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(deadline_s);
  std::vector<int> status(pids.size(), -1);
  size_t done = 0;
  while (done < pids.size()) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (status[i] != -1) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        status[i] = st;
        ++done;
      }
    }
    if (done < pids.size() && std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (status[i] == -1) kill(pids[i], SIGKILL);
      }
      std::cout << mode << ": deadline of " << deadline_s << " s passed, ranks killed\n";
      deadline_s = 1 << 30;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  bool ok = true;
  for (size_t i = 0; i < pids.size(); ++i) {
    const int st = status[i];
    std::cout << mode << " rank " << i << ": "
              << (WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st))
                                : "killed by signal " + std::to_string(WTERMSIG(st)))
              << "\n";
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bench_common::restart_with_openblas_kernels(argv);
  torch::set_num_threads(1);  // two ranks on two cores
  if (const char* role = std::getenv("BENCH_ROLE"); role && std::string(role) == "rank") {
    // The cap first: it covers everything this rank maps from here on, beyond what it maps
    // already (LibTorch's libraries: with CUDA kernels ~2.3 GiB of address space that is
    // mostly never resident, and would otherwise count against the cap).
    rlimit cap{};
    const long mapped_now = proc_kib("/proc/self/status", "VmSize") * 1024;
    cap.rlim_cur = cap.rlim_max =
        static_cast<rlim_t>(mapped_now + std::atol(std::getenv("BENCH_CAP_BYTES")));
    if (setrlimit(RLIMIT_AS, &cap) != 0) {
      std::perror("setrlimit(RLIMIT_AS)");
      return 2;
    }
    tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo").timeout(
        std::chrono::milliseconds(600'000)));
    const int rc = run_rank(std::getenv("BENCH_MODE"), tdist::get_rank());
    if (rc != 0) std::_Exit(rc);  // a failed rank does not wait for its peer
    tdist::destroy_process_group();
    return 0;
  }
  double cap_gib = 11;
  int deadline_s = 1200;
  std::vector<std::string> modes = {"fsdp", "ddp"};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--cap-gib") {
      cap_gib = std::atof(argv[i + 1]);
    } else if (flag == "--deadline-s") {
      deadline_s = std::atoi(argv[i + 1]);
    } else if (flag == "--modes") {
      modes.clear();
      std::stringstream ss(argv[i + 1]);
      for (std::string m; std::getline(ss, m, ',');) modes.push_back(m);
    } else {
      std::cerr << "usage: bench_fsdp_1b [--cap-gib G] [--modes fsdp,ddp] [--deadline-s S]\n";
      return 2;
    }
  }
  const long cap_bytes = static_cast<long>(cap_gib * 1024 * 1024 * 1024);
  const double avail_gib = gib(static_cast<double>(proc_kib("/proc/meminfo", "MemAvailable")));
  const double total_gib = gib(static_cast<double>(proc_kib("/proc/meminfo", "MemTotal")));
  std::cout << "machine: " << total_gib << " GiB, available now " << avail_gib
            << " GiB; cap per rank (RLIMIT_AS, beyond its libraries) " << cap_gib << " GiB\n";
  if (avail_gib < 2 * cap_gib + 1) {
    std::cout << "refusing to start: two ranks under this cap could take " << 2 * cap_gib
              << " GiB, more than is available now (minus 1 GiB). Lower --cap-gib or wait.\n";
    return 2;
  }
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  int failures = 0;
  for (const auto& mode : modes) {
    std::cout << "== " << mode << " ==\n" << std::flush;
    const bool ok = run_mode(self, mode, cap_bytes, deadline_s);
    std::cout << mode << ": " << (ok ? "trained" : "FAILED") << "\n" << std::flush;
    if (!ok) ++failures;
  }
  return failures == 0 ? 0 : 1;
}

// GPU collectives: time per op and size of tdist's NCCL backend ("cpu:gloo,cuda:nccl") or of
// Gloo on CUDA tensors (staged through pinned host memory), at one world size. Every op's
// result is checked on every rank before it is timed, and a wrong element fails the run.
// gpu_collectives_torch.py times PyTorch's torch.distributed on the same ops and sizes, and
// gpu_collectives_report.py puts the two side by side (tools/gpu-check.sh runs all three).
//   bench_gpu_collectives --backend nccl --world 1 --json out.jsonl
//   bench_gpu_collectives --backend gloo --world 2 --device cpu    (the logic, without a GPU)

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/free_port.h"
#include "tdist/comm/distributed.h"

extern char** environ;

namespace {

struct Options {
  std::string backend = "nccl";
  std::string device = "cuda";
  int world = 1;
  int64_t min_bytes = 1 << 16;
  int64_t max_bytes = 1 << 26;
  int step = 16;
  int iters = 20;
  std::string json_path;
};

// One op: fills `in` for `rank`, runs the collective, and says whether `out` holds what it
// must on this rank.
struct Op {
  std::string name;
  std::function<void(at::Tensor& in, at::Tensor& out)> run;
  std::function<int64_t(int64_t numel, int world)> out_numel;
  std::function<bool(const at::Tensor& out, int rank, int world)> check;
};

std::vector<Op> ops() {
  using T = at::Tensor;
  return {
      {"all_reduce", [](T& in, T&) { tdist::all_reduce(in); }, [](int64_t n, int) { return n; },
       // in holds rank + 1 everywhere before: the sum is world (world + 1) / 2.
       [](const T& in_after, int, int w) {
         return in_after.cpu().eq(w * (w + 1) / 2.0).all().item<bool>();
       }},
      {"broadcast", [](T& in, T&) { tdist::broadcast(in, 0); }, [](int64_t n, int) { return n; },
       [](const T& in_after, int, int) { return in_after.cpu().eq(1.0).all().item<bool>(); }},
      {"all_gather_into_tensor", [](T& in, T& out) { tdist::all_gather_into_tensor(out, in); },
       [](int64_t n, int w) { return n * w; },
       [](const T& out, int, int w) {
         const T blocks = out.cpu().view({w, -1});
         for (int r = 0; r < w; ++r) {
           if (!blocks[r].eq(r + 1.0).all().item<bool>()) return false;
         }
         return true;
       }},
      {"reduce_scatter_tensor", [](T& in, T& out) { tdist::reduce_scatter_tensor(out, in); },
       [](int64_t n, int w) { return n / w; },
       [](const T& out, int, int w) { return out.cpu().eq(w * (w + 1) / 2.0).all().item<bool>(); }},
      {"all_to_all_single", [](T& in, T& out) { tdist::all_to_all_single(out, in); },
       [](int64_t n, int) { return n; },
       [](const T& out, int, int w) {
         const T blocks = out.cpu().view({w, -1});
         for (int r = 0; r < w; ++r) {
           if (!blocks[r].eq(r + 1.0).all().item<bool>()) return false;
         }
         return true;
       }},
  };
}

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

int run_rank(const Options& o) {
  const int rank = std::atoi(std::getenv("RANK"));
  const int world = std::atoi(std::getenv("WORLD_SIZE"));
  const char* local = std::getenv("LOCAL_RANK");
  // Ranks beyond the GPU count share GPUs (Gloo allows it; NCCL refuses two ranks on one).
  const int gpu = (local ? std::atoi(local) : rank) % std::max<int>(1, torch::cuda::device_count());
  const c10::Device device =
      o.device == "cuda" ? c10::Device(c10::kCUDA, gpu) : c10::Device(c10::kCPU);
  auto init = tdist::InitProcessGroupOptions().init_method("env://").rank(rank).world_size(world);
  if (o.backend == "nccl") {
    init.backend("cpu:gloo,cuda:nccl").device_id(device.str());
  } else {
    init.backend("gloo");
  }
  tdist::init_process_group(init);
  if (rank == 0) std::printf("%-8s %-24s %5s %12s %12s\n", "impl", "op", "world", "bytes", "us");
  bool all_ok = true;
  for (const Op& op : ops()) {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.step) {
      const int64_t numel = std::max<int64_t>(world, bytes / 4 / world * world);
      const auto options = torch::TensorOptions().dtype(torch::kFloat).device(device);
      at::Tensor in = torch::full({numel}, rank + 1.0, options);
      at::Tensor out = torch::empty({op.out_numel(numel, world)}, options);
      op.run(in, out);
      synchronize(device);
      const bool ok =
          op.check(op.name == "all_reduce" || op.name == "broadcast" ? in : out, rank, world);
      // The ranks agree on the verdict before anything is timed.
      at::Tensor wrong = torch::tensor({ok ? 0 : 1}, torch::kLong);
      tdist::all_reduce(wrong);
      if (wrong.item<int64_t>() != 0) {
        if (rank == 0) {
          std::fprintf(stderr, "bench_gpu_collectives: %s of %lld bytes gave a wrong result\n",
                       op.name.c_str(), static_cast<long long>(bytes));
        }
        all_ok = false;
        continue;
      }
      for (int i = 0; i < 3; ++i) op.run(in, out);
      synchronize(device);
      tdist::barrier();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < o.iters; ++i) op.run(in, out);
      synchronize(device);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count() /
          o.iters;
      if (rank != 0) continue;
      std::printf("%-8s %-24s %5d %12lld %12.1f\n", ("tdist " + o.backend).c_str(), op.name.c_str(),
                  world, static_cast<long long>(numel * 4), us);
      std::fflush(stdout);
      if (!o.json_path.empty()) {
        std::ofstream(o.json_path, std::ios::app)
            << nlohmann::json{{"impl", "tdist"}, {"backend", o.backend}, {"device", o.device},
                              {"op", op.name},   {"world", world},       {"bytes", numel * 4},
                              {"us", us}}
                   .dump()
            << "\n";
      }
    }
  }
  tdist::destroy_process_group();
  return all_ok ? 0 : 1;
}

// The ranks: this program again, with torchrun's variables.
int spawn_ranks(int world, char** argv) {
  const std::string port = std::to_string(bench::free_port());
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    for (const std::string& kv : {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                                  "WORLD_SIZE=" + std::to_string(world),
                                  std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + port}) {
      env.push_back(kv);
    }
    std::vector<char*> envp;
    for (auto& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) {
      std::perror("bench_gpu_collectives: posix_spawn");
      return 1;
    }
    pids.push_back(pid);
  }
  int worst = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    worst = std::max(worst, code);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("GPU collectives of tdist (NCCL, Gloo on CUDA tensors), verified then timed",
               "bench_gpu_collectives");
  app.add_option("--backend", o.backend, "nccl or gloo")
      ->check(CLI::IsMember({"nccl", "gloo"}))
      ->capture_default_str();
  app.add_option("--device", o.device, "cuda, or cpu to check the benchmark itself")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  app.add_option("--world", o.world, "Ranks (processes on this machine)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--min-bytes", o.min_bytes, "Smallest message")->capture_default_str();
  app.add_option("--max-bytes", o.max_bytes, "Largest message")->capture_default_str();
  app.add_option("--step", o.step, "Size factor between rows")
      ->check(CLI::Range(2, 1024))
      ->capture_default_str();
  app.add_option("--iters", o.iters, "Timed iterations per row")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--json", o.json_path, "Append each row as a JSON line to FILE");
  CLI11_PARSE(app, argc, argv);
  if (o.device == "cuda" && !torch::cuda::is_available()) {
    std::cerr << "bench_gpu_collectives: --device cuda but this machine has no CUDA GPU; use "
                 "--device cpu to check the benchmark, or run it on a GPU machine\n";
    return 2;
  }
  try {
    if (std::getenv("RANK") == nullptr) return spawn_ranks(o.world, argv);
    return run_rank(o);
  } catch (const std::exception& e) {
    std::cerr << "bench_gpu_collectives: error: " << e.what() << "\n";
    return 1;
  }
}

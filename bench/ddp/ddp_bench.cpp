// bench_ddp: step time of one MLP training step (forward, backward, SGD step)
//   single   one process, no communication (the per-rank compute floor)
//   tdist    tdist::ddp::DistributedDataParallel, world 2 (ranks are processes)
//   pytorch  Python PyTorch DistributedDataParallel (gloo), world 2, same model and sizes
// side by side, best of --rounds, with ratios. The benchmark verifies what it times: after
// training, both ranks' parameter checksums must agree (#wrong counts ranks that differ).
//
//   bench_ddp [--width 1024] [--depth 4] [--batch 32] [--warmup 10] [--steps 50]
//             [--threads 1] [--rounds 3]

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/free_port.h"
#include "common/openblas_kernels.h"
#include "tdist/comm/distributed.h"
#include "tdist/ddp/distributed_data_parallel.h"

namespace {

struct Config {
  int width = 1024, depth = 4, batch = 32, warmup = 10, steps = 50, threads = 1, rounds = 3;
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

torch::nn::Sequential make_model(const Config& c) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int i = 0; i < c.depth; ++i) {
    model->push_back(torch::nn::Linear(c.width, c.width));
    model->push_back(torch::nn::ReLU());
  }
  return model;
}

struct Result {
  double step_ms = 0;
  double checksum = 0;
};

/// Times warmup+steps iterations; `ddp` may be null (single process).
Result train(const Config& c, torch::nn::Sequential model,
             tdist::ddp::DistributedDataParallel<torch::nn::Sequential>* ddp, int rank) {
  torch::optim::SGD opt(model->parameters(), 0.01);
  torch::manual_seed(1 + rank);
  auto x = torch::randn({c.batch, c.width}), y = torch::randn({c.batch, c.width});
  std::chrono::steady_clock::time_point start;
  for (int step = 0; step < c.warmup + c.steps; ++step) {
    if (step == c.warmup) {
      if (ddp) tdist::barrier();
      start = std::chrono::steady_clock::now();
    }
    opt.zero_grad();
    at::Tensor out = ddp ? ddp->forward(x) : model->forward(x);
    torch::mse_loss(out, y).backward();
    opt.step();
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  double checksum = 0;
  for (const auto& p : model->parameters())
    checksum += p.detach().to(torch::kDouble).sum().item<double>();
  return {ms / c.steps, checksum};
}

Config config_from_env() {
  Config c;
  c.width = env_int("BENCH_WIDTH", c.width);
  c.depth = env_int("BENCH_DEPTH", c.depth);
  c.batch = env_int("BENCH_BATCH", c.batch);
  c.warmup = env_int("BENCH_WARMUP", c.warmup);
  c.steps = env_int("BENCH_STEPS", c.steps);
  c.threads = env_int("BENCH_THREADS", c.threads);
  return c;
}

/// A rank of the tdist DDP run (re-executed with BENCH_ROLE=rank).
int run_rank() {
  const Config c = config_from_env();
  torch::set_num_threads(c.threads);
  tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo"));
  auto model = make_model(c);
  tdist::ddp::DistributedDataParallel<torch::nn::Sequential> ddp(model);
  const Result r = train(c, model, &ddp, tdist::get_rank());
  std::ofstream(std::getenv("BENCH_RESULT"))
      << r.step_ms << " " << std::setprecision(17) << r.checksum << "\n";
  tdist::destroy_process_group();
  return 0;
}

/// Runs `argv` as 2 ranks with the env:// variables set; returns each rank's result.
std::vector<Result> run_world2(const std::vector<std::string>& argv, const Config& c,
                               const std::string& tag) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("bench_ddp_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const int port = bench::free_port();
  std::vector<pid_t> pids;
  std::vector<std::string> files;
  for (int rank = 0; rank < 2; ++rank) {
    files.push_back((dir / (tag + std::to_string(rank) + ".txt")).string());
    std::filesystem::remove(files.back());
    const pid_t pid = fork();
    if (pid == 0) {
      const std::map<std::string, std::string> env{{"MASTER_ADDR", "127.0.0.1"},
                                                   {"MASTER_PORT", std::to_string(port)},
                                                   {"RANK", std::to_string(rank)},
                                                   {"WORLD_SIZE", "2"},
                                                   {"BENCH_ROLE", "rank"},
                                                   {"BENCH_RESULT", files.back()},
                                                   {"BENCH_WIDTH", std::to_string(c.width)},
                                                   {"BENCH_DEPTH", std::to_string(c.depth)},
                                                   {"BENCH_BATCH", std::to_string(c.batch)},
                                                   {"BENCH_WARMUP", std::to_string(c.warmup)},
                                                   {"BENCH_STEPS", std::to_string(c.steps)},
                                                   {"BENCH_THREADS", std::to_string(c.threads)},
                                                   {"OMP_NUM_THREADS", std::to_string(c.threads)}};
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      std::perror("execv");
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<Result> results;
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    Result r{NAN, NAN};
    std::ifstream in(files[i]);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) || !(in >> r.step_ms >> r.checksum)) {
      std::cerr << tag << " rank " << i << " failed (status " << status << ")\n";
      r = {NAN, NAN};
    }
    results.push_back(r);
  }
  return results;
}

struct Row {
  std::string name;
  double best_ms = INFINITY;
  int wrong = 0;
};

}  // namespace

int main(int argc, char** argv) {
  bench_common::restart_with_openblas_kernels(argv);
  if (const char* role = std::getenv("BENCH_ROLE"); role && std::string(role) == "rank") {
    return run_rank();
  }
  Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (flag == "--width")
      c.width = v;
    else if (flag == "--depth")
      c.depth = v;
    else if (flag == "--batch")
      c.batch = v;
    else if (flag == "--warmup")
      c.warmup = v;
    else if (flag == "--steps")
      c.steps = v;
    else if (flag == "--threads")
      c.threads = v;
    else if (flag == "--rounds")
      c.rounds = v;
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  torch::set_num_threads(c.threads);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();

  Row single{"single process"}, tdist_row{"tdist DDP (world 2)"},
      torch_row{"PyTorch DDP (world 2)"};
  for (int round = 0; round < c.rounds; ++round) {
    single.best_ms = std::min(single.best_ms, train(c, make_model(c), nullptr, 0).step_ms);
    for (auto* row : {&tdist_row, &torch_row}) {
      const auto results = row == &tdist_row
                               ? run_world2({self}, c, "tdist")
                               : run_world2({TDIST_PYTHON, TDIST_BENCH_DDP_PY}, c, "torch");
      double worst = 0;
      for (const auto& r : results) worst = std::max(worst, r.step_ms);
      // Verify: every rank must end with the same parameters.
      const bool agree = std::isfinite(results[0].checksum) &&
                         std::abs(results[0].checksum - results[1].checksum) <=
                             1e-9 * std::max(1.0, std::abs(results[0].checksum));
      if (!agree) ++row->wrong;
      if (std::isfinite(worst)) row->best_ms = std::min(row->best_ms, worst);
    }
  }

  const double params = static_cast<double>(c.depth) * (c.width * c.width + c.width);
  std::printf(
      "# bench_ddp: MLP %d x Linear(%d, %d) (%.2fM params, %.1f MB grads), batch %d/rank, "
      "SGD, %d threads/rank, %d warmup + %d timed steps, best of %d rounds\n",
      c.depth, c.width, c.width, params / 1e6, params * 4 / 1e6, c.batch, c.threads, c.warmup,
      c.steps, c.rounds);
  std::printf("%-24s %12s %12s %14s %7s\n", "implementation", "step ms", "vs single",
              "vs PyTorch DDP", "#wrong");
  for (const auto* row : {&single, &tdist_row, &torch_row}) {
    std::printf("%-24s %12.3f %12.2f %14.2f %7d\n", row->name.c_str(), row->best_ms,
                row->best_ms / single.best_ms, row->best_ms / torch_row.best_ms, row->wrong);
  }
  std::printf("tdist DDP / PyTorch DDP step time: %.2fx (target <= 0.90x)\n",
              tdist_row.best_ms / torch_row.best_ms);
  return tdist_row.wrong + torch_row.wrong == 0 ? 0 : 1;
}

// Forward + backward throughput of a model folder in tdist, the C++ half of run.sh (the other
// is models_bench.py, timing the same folder in transformers).
//   bench_models DIR --steps N --warmup W --threads T --batch B --seq S
// Prints one JSON line: tokens/s (median over the timed steps), step times, and the mean
// loss of the timed steps (the same inputs as the Python side, so the losses must agree).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "tdist/models/pretrained.h"

namespace {

int flag(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

// The batch both sides use: a fixed pseudo-random sequence of token ids.
at::Tensor batch_ids(int64_t vocab, int64_t batch, int64_t seq) {
  std::vector<int64_t> ids(static_cast<size_t>(batch * seq));
  uint64_t x = 12345;
  for (auto& id : ids) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    id = static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return torch::tensor(ids).view({batch, seq});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: bench_models DIR [--steps N] [--warmup W] [--threads T] "
                 "[--batch B] [--seq S]\n");
    return 2;
  }
  const int steps = flag(argc, argv, "--steps", 5), warmup = flag(argc, argv, "--warmup", 1);
  at::set_num_threads(flag(argc, argv, "--threads", 2));
  auto model =
      tdist::models::from_pretrained(argv[1], tdist::models::LoadOptions().dtype(at::kFloat));
  model->train();
  const int64_t batch = flag(argc, argv, "--batch", 4), seq = flag(argc, argv, "--seq", 256);
  const at::Tensor ids = batch_ids(model->config().vocab_size, batch, seq);
  std::vector<double> times;
  double loss_sum = 0;
  for (int step = 0; step < warmup + steps; ++step) {
    model->zero_grad();
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor loss = tdist::models::causal_lm_loss(model->forward(ids), ids);
    loss.backward();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step >= warmup) {
      times.push_back(seconds);
      loss_sum += loss.item<double>();
    }
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  std::printf(
      "{\"impl\": \"tdist\", \"tokens_per_s\": %.1f, \"median_step_s\": %.5f, "
      "\"min_step_s\": %.5f, \"loss\": %.6f, \"params\": %lld}\n",
      static_cast<double>(batch * seq) / median, median, sorted.front(),
      loss_sum / static_cast<double>(times.size()),
      static_cast<long long>(model->config().num_parameters()));
  return 0;
}

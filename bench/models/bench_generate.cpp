// Greedy generation with the KV cache in tdist, the C++ half of `run.sh --generate` (the
// other is models_bench.py generate, transformers' generate() on the same folder).
//   bench_generate DIR [--threads T] [--batch B] [--prompt P] [--new N] [--rounds R]
// Prints one JSON line: new tokens/s (batch x N over the median round) and a checksum of the
// generated ids, so that both sides are seen to produce the same tokens.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "tdist/models/generation.h"
#include "tdist/models/pretrained.h"

namespace {

int flag(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

// The prompts both sides use: a fixed pseudo-random sequence of token ids.
at::Tensor prompt_ids(int64_t vocab, int64_t batch, int64_t seq) {
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
                 "usage: bench_generate DIR [--threads T] [--batch B] [--prompt P] [--new N] "
                 "[--rounds R]\n");
    return 2;
  }
  at::set_num_threads(flag(argc, argv, "--threads", 1));
  auto model =
      tdist::models::from_pretrained(argv[1], tdist::models::LoadOptions().dtype(at::kFloat));
  const int64_t batch = flag(argc, argv, "--batch", 1), prompt = flag(argc, argv, "--prompt", 16);
  const int64_t fresh = flag(argc, argv, "--new", 64);
  const int rounds = flag(argc, argv, "--rounds", 3);
  const at::Tensor ids = prompt_ids(model->config().vocab_size, batch, prompt);
  // No EOS: every round generates exactly `fresh` tokens per row, as the Python side does.
  const auto options = tdist::models::GenerationOptions().max_new_tokens(fresh);
  std::vector<double> times;
  at::Tensor out;
  for (int r = 0; r < rounds + 1; ++r) {  // the first round warms up
    const auto start = std::chrono::steady_clock::now();
    out = tdist::models::generate(*model, ids, options);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r > 0) times.push_back(seconds);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  uint64_t checksum = 0;
  const at::Tensor flat = out.contiguous().view({-1});
  for (int64_t i = 0; i < flat.numel(); ++i) {
    checksum = checksum * 1000003u + static_cast<uint64_t>(flat[i].item<int64_t>());
  }
  std::printf(
      "{\"impl\": \"tdist\", \"tokens_per_s\": %.1f, \"median_s\": %.5f, \"min_s\": %.5f, "
      "\"generated\": %lld, \"checksum\": \"%llu\"}\n",
      static_cast<double>(batch * fresh) / median, median, times.front(),
      static_cast<long long>(out.size(1) - prompt), static_cast<unsigned long long>(checksum));
  return 0;
}

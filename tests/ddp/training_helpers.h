#pragma once

// Shared by the DDP, ZeRO and Join tests: a tiny MLP, per-rank data, a single-process
// reference trainer and cross-rank comparisons.

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tdist/comm/distributed.h"
#include "tdist/ddp/distributed_data_parallel.h"

namespace tdist::testing {

struct MlpImpl : torch::nn::Module {
  MlpImpl(int in = 8, int hidden = 16, int out = 4) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

/// The model as rank `rank` builds it before DDP (different per rank, so the construction
/// broadcast is tested: everyone must end up with rank 0's initial values).
inline Mlp make_mlp(int rank) {
  torch::manual_seed(100 + rank);
  return Mlp();
}

/// batches[r][s] = (input, target) of rank r at its step s; rank r has counts[r] steps.
struct Batches {
  std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> of_rank;
  int max_steps() const {
    size_t m = 0;
    for (const auto& r : of_rank) m = std::max(m, r.size());
    return static_cast<int>(m);
  }
};

inline Batches make_batches(const std::vector<int>& counts, int batch = 4) {
  torch::manual_seed(1234);
  Batches out;
  for (size_t r = 0; r < counts.size(); ++r) {
    out.of_rank.emplace_back();
    for (int s = 0; s < counts[r]; ++s) {
      out.of_rank[r].emplace_back(torch::randn({batch, 8}), torch::randn({batch, 4}));
    }
  }
  return out;
}

inline at::Tensor loss_of(Mlp& model, const std::pair<at::Tensor, at::Tensor>& b) {
  return torch::mse_loss(model->forward(b.first), b.second);
}

/// The same loss through a DDP wrapper's forward.
template <class M>
at::Tensor loss_of(ddp::DistributedDataParallel<M>& net,
                   const std::pair<at::Tensor, at::Tensor>& b) {
  return torch::mse_loss(net.forward(b.first), b.second);
}

/// Single-process reference: at step s every rank still active contributes its mean loss
/// divided by the world size (what averaged DDP gradients compute); `accumulate` micro
/// steps are summed before each optimizer step.
inline void train_reference(Mlp& model, torch::optim::Optimizer& opt, const Batches& data,
                            int world, int accumulate = 1) {
  const int steps = data.max_steps();
  for (int s = 0; s < steps; ++s) {
    if (s % accumulate == 0) opt.zero_grad();
    at::Tensor loss = torch::zeros({});
    for (int r = 0; r < world; ++r) {
      if (s < static_cast<int>(data.of_rank[r].size()))
        loss = loss + loss_of(model, data.of_rank[r][s]);
    }
    (loss / world).backward();
    if (s % accumulate == accumulate - 1 || s == steps - 1) opt.step();
  }
}

inline double max_abs_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, (a[i] - b[i]).abs().max().item<double>());
  }
  return m;
}

/// Max difference between this rank's parameters and every other rank's (0 when equal).
inline double max_diff_across_ranks(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> flat_parts;
  for (const auto& p : params) flat_parts.push_back(p.detach().reshape({-1}));
  at::Tensor flat = torch::cat(flat_parts);
  std::vector<at::Tensor> all;
  for (int r = 0; r < get_world_size(); ++r) all.push_back(torch::empty_like(flat));
  all_gather(all, flat);
  double m = 0;
  for (const auto& t : all) m = std::max(m, (t - flat).abs().max().item<double>());
  return m;
}

inline int world_from_env() {
  return std::stoi(std::getenv("WORLD_SIZE"));
}
inline int rank_from_env() {
  return std::stoi(std::getenv("RANK"));
}
inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

}  // namespace tdist::testing

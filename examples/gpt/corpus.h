#pragma once

// The training text: a file read once, tokenized, split into train and validation tokens,
// and a sampler that gives each rank its own share of every global batch.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace gpt {

class Corpus {
 public:
  /// Reads `path` and keeps the last `val_fraction` of it for validation. Throws
  /// tdist::InvalidArgument when the file is missing or too short for `block_size`.
  Corpus(const std::string& path, double val_fraction, int64_t block_size);
  /// From text already in memory (tests).
  static Corpus from_text(const std::string& text, double val_fraction, int64_t block_size);

  const torch::Tensor& train() const { return train_; }  // int64 [N_train]
  const torch::Tensor& val() const { return val_; }      // int64 [N_val]
  const std::string& path() const { return path_; }
  int64_t size_bytes() const { return size_bytes_; }

 private:
  Corpus() = default;
  void split(const std::string& text, double val_fraction, int64_t block_size);
  std::string path_;
  int64_t size_bytes_ = 0;
  torch::Tensor train_;
  torch::Tensor val_;
};

struct Batch {
  torch::Tensor x;  // [B, T] int64 inputs
  torch::Tensor y;  // [B, T] int64 targets (x shifted by one)
  /// The batch on `device` (itself when it is there already).
  Batch to(const torch::Device& device) const { return {x.to(device), y.to(device)}; }
};

/// Draws random windows of block_size + 1 tokens. Each optimizer step has one global batch
/// of grad_accum x batch_size x world_size windows, a pure function of (seed, step), drawn the
/// same on every rank; micro-step m of rank r takes rows [m][*][r] of it. So the ranks split
/// one global batch, a run at world size W with batch B computes the same gradients as world
/// 1 with batch W*B (or grad_accum W), and a resumed run draws what the uninterrupted one
/// would have.
class BatchSampler {
 public:
  BatchSampler(torch::Tensor tokens, int64_t block_size, int64_t batch_size, int rank,
               int world_size, uint64_t seed, int64_t grad_accum = 1);
  Batch get(int64_t step, int64_t micro_step) const;

 private:
  torch::Tensor tokens_;
  int64_t block_size_;
  int64_t batch_size_;
  int64_t grad_accum_;
  int rank_;
  int world_size_;
  uint64_t seed_;
};

}  // namespace gpt

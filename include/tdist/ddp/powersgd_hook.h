#pragma once

// PowerSGD gradient compression for DDP (torch.distributed.algorithms.ddp_comm_hooks.
// powerSGD_hook, Vogels et al. 2019): each gradient matrix M worth compressing travels as two
// low-rank factors P = M Q and Q = M^T P (one power iteration, warm-started from the previous
// step's Q), the rest uncompressed in one all-reduce; the error the compression leaves is added
// back to the next step's gradient (error feedback). The first start_powerSGD_iter iterations
// are plain averaging all-reduces.
//
//   auto state = std::make_shared<tdist::ddp::PowerSGDState>(
//       tdist::ddp::PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(100));
//   ddp.register_comm_hook(state, tdist::ddp::powerSGD_hook);
//
// The computation follows PyTorch's step for step (the same random Q per seed, the same
// orthogonalisation, the same order of tensors in the factors' buffers), so a job that moves
// between tdist and PyTorch keeps its numerics (checked against the .venv's PyTorch in
// tests/ddp/powersgd_test.cpp).

#include <cstdint>
#include <map>
#include <random>

#include "tdist/arg.h"
#include "tdist/ddp/comm_hooks.h"

namespace tdist::ddp {

struct PowerSGDOptions {
  /// The group to reduce over; null: the bucket's (DDP's) group.
  TDIST_ARG(ProcessGroupPtr, process_group) = nullptr;
  /// Rank r of the approximation M ~ P Q^T (P: n x r, Q: m x r); lower compresses more.
  TDIST_ARG(int64_t, matrix_approximation_rank) = 1;
  /// Iterations of plain all-reduce before compression starts (> 1 with error feedback or
  /// warm start, as in PyTorch).
  TDIST_ARG(int64_t, start_powerSGD_iter) = 1000;
  /// A matrix is compressed only when (n + m) * r * min_compression_rate < n * m.
  TDIST_ARG(double, min_compression_rate) = 2.0;
  /// Add the previous step's compression error to the gradient before compressing.
  TDIST_ARG(bool, use_error_feedback) = true;
  /// Start each step's power iteration from the previous step's Q (else a fresh random Q).
  TDIST_ARG(bool, warm_start) = true;
  /// Added to column norms while orthogonalising (0: exact, but an all-zero column gives NaN).
  TDIST_ARG(double, orthogonalization_epsilon) = 0.0;
  /// Seeds the generator of the random Q (numpy's RandomState(seed) draws, as PyTorch's).
  TDIST_ARG(uint32_t, random_seed) = 0;
  /// Compress same-shaped matrices of a bucket in one batched product (costs a stacked copy).
  TDIST_ARG(bool, batch_tensors_with_same_shape) = false;
};

/// PowerSGD's hyperparameters and the state it keeps between steps (error feedback and
/// warm-start factors, per bucket index). One state serves one DDP model.
class PowerSGDState {
 public:
  explicit PowerSGDState(PowerSGDOptions options = {});

  const PowerSGDOptions& options() const { return options_; }
  /// Iterations counted so far (one per backward, on its last bucket).
  int64_t iter() const { return iter_; }

  struct CompressionStats {
    double compress_rate = 0;  // numel before / numel after (0 before any compression)
    int64_t numel_before_compression = 0;
    int64_t numel_after_compression = 0;
  };
  CompressionStats compression_stats() const;

 private:
  friend CommHookFuture powerSGD_hook(PowerSGDState& state, GradBucket& bucket);
  friend struct PowerSGDStep;

  /// A seed for torch's generator, drawn as numpy's RandomState.randint(1_000_000_000).
  uint64_t next_seed();
  void maybe_increase_iter(bool is_last_bucket);

  PowerSGDOptions options_;
  std::mt19937 rng_;
  std::map<size_t, at::Tensor> error_;     // per bucket: the last compression error
  std::map<size_t, at::Tensor> p_memory_;  // per bucket: the P factors, flat
  std::map<size_t, at::Tensor> q_memory_;  // per bucket: the Q factors, flat
  int64_t iter_ = 0;
  int64_t numel_before_ = 0;
  int64_t numel_after_ = 0;
};

/// The PowerSGD communication hook (register it with the state it updates, as above).
CommHookFuture powerSGD_hook(PowerSGDState& state, GradBucket& bucket);

}  // namespace tdist::ddp

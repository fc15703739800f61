#pragma once

// Learning-rate schedule: linear warmup to max_lr, then cosine decay to min_lr.

#include <cstdint>

namespace gpt {

struct LrSchedule {
  double max_lr = 3e-3;
  double min_lr = 3e-4;
  int64_t warmup_steps = 20;
  int64_t total_steps = 300;

  /// Learning rate for optimizer step `step` (0-based):
  ///   step < warmup:      max_lr * (step + 1) / warmup
  ///   warmup <= step < total: min_lr + (max_lr - min_lr) * (1 + cos(pi * progress)) / 2
  ///   step >= total:     min_lr
  double at(int64_t step) const;
  /// Throws tdist::InvalidArgument naming the bad value.
  void validate() const;
};

}  // namespace gpt

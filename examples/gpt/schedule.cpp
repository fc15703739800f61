#include "gpt/schedule.h"

#include <algorithm>
#include <cmath>

#include "tdist/error.h"

namespace gpt {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) {
    return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (step >= total_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) /
                          static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

void LrSchedule::validate() const {
  TDIST_CHECK_ARG(max_lr > 0.0, "--lr must be > 0, got " + std::to_string(max_lr));
  TDIST_CHECK_ARG(min_lr >= 0.0 && min_lr <= max_lr,
                  "--min-lr must be in [0, --lr=" + std::to_string(max_lr) + "], got " +
                      std::to_string(min_lr));
  TDIST_CHECK_ARG(warmup_steps >= 0 && warmup_steps <= total_steps,
                  "--warmup must be in [0, --steps=" + std::to_string(total_steps) + "], got " +
                      std::to_string(warmup_steps));
}

}  // namespace gpt

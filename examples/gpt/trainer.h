#pragma once

// The training job: one loop for single, DDP and FSDP (see parallel.h), with validation,
// checkpoints, progress, metrics, plot, trace and a sample at the end.

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "gpt/config.h"
#include "gpt/world.h"

namespace gpt {

struct TrainResult {
  std::string mode;        ///< the resolved parallel mode
  int64_t start_step = 0;  ///< > 0 when resumed
  int64_t steps_done = 0;
  std::vector<double> train_loss;  ///< mean over ranks, one per step from start_step
  std::vector<std::pair<int64_t, double>> val_loss;  ///< (step, loss), step 0 = before training
  double tokens_per_s = 0.0;                         ///< global, averaged over the run
  double seconds = 0.0;
  std::string sample;  ///< generated text (rank 0; empty elsewhere or when off)
};

/// Trains on this process's rank of `world` (already initialised by init_world). Writes the
/// run dir's outputs; progress goes to `out` on rank 0.
TrainResult train(const TrainConfig& config, const World& world, std::ostream& out);

/// The whole `gpt train` command: spawns --nproc ranks when not launched as a rank, joins
/// the process group, trains, reports errors as "gpt: error: ..." and returns the exit code.
int run_train_command(const TrainConfig& config, const std::vector<std::string>& argv);

/// The `gpt generate` command.
int run_generate_command(const GenerateConfig& config);

}  // namespace gpt

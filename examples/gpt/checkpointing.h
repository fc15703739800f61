#pragma once

// Step-numbered checkpoints of a training run, <run_dir>/checkpoints/step_<N>/, and
// resuming from the newest complete one. With tdist::checkpoint in the build every rank
// writes its own slices in parallel (FSDP shards included), and a run saved at one world
// size resumes at another. Without it, rank 0 writes torch::save archives of the
// (replicated) model and optimizer; FSDP runs then cannot checkpoint.

#include <cstdint>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "gpt/model.h"
#include "gpt/parallel.h"
#include "gpt/world.h"

namespace gpt {

class Checkpointer {
 public:
  Checkpointer(std::string run_dir, World world);

  /// Collective: every rank calls it after optimizer step `step` (steps done).
  void save(int64_t step, Parallel& parallel, torch::optim::AdamW& optimizer);
  /// Collective: loads the newest complete checkpoint into the model and optimizer; returns
  /// its step, or nullopt when there is none (a fresh start).
  std::optional<int64_t> load_latest(Parallel& parallel, torch::optim::AdamW& optimizer);

  const std::string& root() const { return root_; }
  /// "tdist::checkpoint" or "torch::save (rank 0)".
  static std::string backend_name();

 private:
  std::string root_;
  World world_;
};

/// <run_dir>/config.json: the run's TrainConfig as JSON (written by rank 0 at start).
std::string config_path(const std::string& run_dir);
/// The GPT of a training run: the shape from config.json, the weights from the newest
/// checkpoint (whatever world size and mode saved it). Throws tdist::CheckpointError naming
/// what is missing.
/// `step` >= 0: that step's checkpoint instead of the newest.
GPT load_model_from_run(const std::string& run_dir, int64_t step = -1);
/// Newest complete step directory under <run_dir>/checkpoints, if any.
std::optional<std::string> newest_checkpoint(const std::string& run_dir);
/// The complete checkpoint of `step` under <run_dir>/checkpoints, if any.
std::optional<std::string> checkpoint_at_step(const std::string& run_dir, int64_t step);

}  // namespace gpt

#pragma once

// Step-numbered checkpoints of a training run, <run_dir>/checkpoints/step_<N>/, and
// resuming from the newest complete one. With tdist::checkpoint in the build every rank
// writes its own slices in parallel (FSDP shards included), and a run saved at one world
// size resumes at another. Without it, rank 0 writes torch::save archives of the
// (replicated) model and optimizer; FSDP runs then cannot checkpoint.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "gpt/parallel.h"
#include "gpt/world.h"

namespace gpt {

class Checkpointer {
 public:
  /// `async`: save() returns once the state is copied to host memory and the files are
  /// written on a background thread (with tdist::checkpoint; the fallback always saves
  /// synchronously).
  Checkpointer(std::string run_dir, World world, bool async = false);
  /// Waits for a background save in flight (its failure is printed, not thrown).
  ~Checkpointer();

  /// Collective: every rank calls it after optimizer step `step` (steps done), the data
  /// loader then at `data_position` (Note [The loader's position]). An asynchronous save
  /// first waits for the previous one and throws its error.
  void save(int64_t step, int64_t data_position, Parallel& parallel,
            torch::optim::AdamW& optimizer);
  /// Waits for the background save in flight, if any; throws its error.
  void wait();
  struct Resumed {
    int64_t step = 0;
    int64_t data_position = 0;
  };
  /// Collective: loads the newest complete checkpoint into the model and optimizer; returns
  /// its step and data position, or nullopt when there is none (a fresh start).
  std::optional<Resumed> load_latest(Parallel& parallel, torch::optim::AdamW& optimizer);

  const std::string& root() const { return root_; }
  /// "tdist::checkpoint" or "torch::save (rank 0)".
  static std::string backend_name();

 private:
  struct Background;  // the manager of asynchronous saves, kept between saves

  std::string root_;
  World world_;
  std::unique_ptr<Background> background_;
};

/// <run_dir>/config.json: the run's TrainConfig as JSON (written by rank 0 at start).
std::string config_path(const std::string& run_dir);
/// <run_dir>/model/: the model's config.json and its tokenizer files, written at the start
/// of a run (the folder `gpt export --format hf` completes with the weights).
std::string model_files_dir(const std::string& run_dir);
/// The model of a training run, whole in this process: its config from model/config.json,
/// the weights from the newest checkpoint (whatever world size and mode saved it), or
/// `step`'s when >= 0. Throws tdist::CheckpointError naming what is missing.
Model load_model_from_run(const std::string& run_dir, int64_t step = -1);
/// Newest complete step directory under <run_dir>/checkpoints, if any.
std::optional<std::string> newest_checkpoint(const std::string& run_dir);
/// The complete checkpoint of `step` under <run_dir>/checkpoints, if any.
std::optional<std::string> checkpoint_at_step(const std::string& run_dir, int64_t step);

}  // namespace gpt

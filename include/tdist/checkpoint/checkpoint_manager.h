#pragma once

// Step-numbered checkpoints under one root, the last `keep_last` kept, resuming from the
// newest valid one. Layout: <root>/step_00000120/ (a checkpoint, see checkpoint.h).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tdist/arg.h"
#include "tdist/checkpoint/async_save.h"
#include "tdist/checkpoint/checkpoint.h"

namespace tdist::checkpoint {

struct CheckpointManagerOptions {
  /// Complete checkpoints to keep; older ones are deleted after each successful save.
  TDIST_ARG(int, keep_last) = 3;
  TDIST_ARG(CoordinatorPtr, coordinator) = nullptr;
  /// Passed to every save (the coordinator above wins over the one in here).
  TDIST_ARG(SaveOptions, save_options) = SaveOptions{};
  /// Before loading, read every block of a candidate (else only its metadata and sizes);
  /// corrupt blocks are caught during the load either way.
  TDIST_ARG(bool, verify_before_load) = false;
};

struct CheckpointEntry {
  int64_t step = -1;  // -1 for a partial directory whose step cannot be told
  std::string path;
  CheckpointStatus status = CheckpointStatus::kMissing;
  std::string detail;
};

class CheckpointManager {
 public:
  explicit CheckpointManager(std::string root, CheckpointManagerOptions options = {});

  /// Collective. Saves into <root>/step_<step>, then applies retention. Returns the path.
  /// Waits for an asynchronous save in flight first.
  std::string save(int64_t step, const ShardedStateDict& state, const ExtraState& extra);

  /// Collective. save() on a background thread (async_save.h): returns once `state` is
  /// copied to host memory; retention runs after the commit. Background saves agree through
  /// the options' coordinator if one is set (it must not be the default process group's,
  /// Note [Async save's agreement]), else through the default group's store.
  SaveFuture async_save(int64_t step, const ShardedStateDict& state, const ExtraState& extra);
  /// Waits for the asynchronous save in flight, if any; throws its error (once).
  void wait();

  /// Collective. Loads the newest checkpoint that loads on every rank, skipping incomplete or
  /// corrupt ones with a warning on stderr. nullopt when none is valid (a fresh start).
  std::optional<LoadResult> load_latest(ShardedStateDict& state, const LoadOptions& options = {});
  /// load_latest with any loader (called with each candidate directory, newest first, and
  /// the options to pass on; it must throw CheckpointError on every rank to move on), e.g.
  /// load_module (see load_latest_module in module_state.h).
  using Loader = std::function<LoadResult(const std::string& dir, const LoadOptions& options)>;
  std::optional<LoadResult> load_latest(const Loader& loader, const LoadOptions& options = {});

  /// Every step directory and partial save under root, oldest first, with its status
  /// (metadata and sizes checked; data blocks not read).
  std::vector<CheckpointEntry> list() const;

  /// Path of step's directory (whether or not it exists).
  std::string path_for(int64_t step) const;
  const std::string& root() const { return root_; }

 private:
  void apply_retention();
  CoordinatorPtr coordinator();

  std::string root_;
  CheckpointManagerOptions options_;
  CoordinatorPtr coordinator_;
  std::unique_ptr<AsyncCheckpointer> async_;
};

}  // namespace tdist::checkpoint

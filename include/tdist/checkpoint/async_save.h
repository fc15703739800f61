#pragma once

// Saving a checkpoint while training goes on (PyTorch's dcp.async_save): a save copies every
// local tensor into host memory (pinned when the tensor is on a GPU) and returns; a
// background thread then runs the same plan -> write -> commit as save() (checkpoint.h), so
// the files appear atomically or not at all. One save is in flight at a time: the next one
// first waits for it.
//
// Note [Async save's agreement]: the background thread agrees with the other ranks through
// its own coordinator, never through the collectives training uses, whose order it would
// break. The default is a StoreCoordinator over the default group's store; a process group
// of the checkpointer's own (new_group) works too. The default group itself is refused.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "tdist/checkpoint/checkpoint.h"

namespace tdist::checkpoint {

namespace detail {
struct AsyncSaveState;
}

/// One asynchronous save. Copies share the save they refer to.
class SaveFuture {
 public:
  SaveFuture() = default;
  /// False for a default-constructed future (no save).
  bool valid() const { return state_ != nullptr; }
  /// True once the save committed or failed; never blocks.
  bool done() const;
  /// Blocks until the save ends; throws its CheckpointError (on every rank: the ranks agree)
  /// if it failed.
  void wait() const;
  /// The checkpoint directory being written.
  const std::string& path() const;

 private:
  friend class AsyncCheckpointer;
  explicit SaveFuture(std::shared_ptr<detail::AsyncSaveState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::AsyncSaveState> state_;
};

/// Runs asynchronous saves one at a time and keeps their host staging buffers between saves
/// (a state of the same shapes is copied into the same memory again: one extra copy of this
/// rank's state lives in host memory for the checkpointer's lifetime).
class AsyncCheckpointer {
 public:
  /// Every save agrees through `coordinator`, unless its SaveOptions name another; null means
  /// the default of Note [Async save's agreement] (a LocalCoordinator outside a process group).
  explicit AsyncCheckpointer(CoordinatorPtr coordinator = nullptr);
  /// Waits for the save in flight; a failure it ends with is printed, not thrown.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  /// Collective. Waits for the previous save; if that one failed and wait() has not reported
  /// it yet, throws its error instead (on every rank) and saves nothing. Then copies `state`
  /// into host memory and returns: `state` may change as soon as this returns. `options` as
  /// for save(). `after_commit` (optional) runs on the background thread once the checkpoint
  /// is committed; what it throws fails the save's future.
  SaveFuture save(const ShardedStateDict& state, const ExtraState& extra, const std::string& dir,
                  const SaveOptions& options = {}, std::function<void()> after_commit = nullptr);

  /// Waits for the save in flight, if any; throws its error if it failed (once: a later
  /// save() then starts normally).
  void wait();

  /// Bytes of host staging memory held.
  int64_t staged_bytes() const;

 private:
  ShardedStateDict stage(const ShardedStateDict& state);
  void join_writer();

  CoordinatorPtr coordinator_;
  std::map<std::string, at::Tensor> staging_;
  std::shared_ptr<detail::AsyncSaveState> in_flight_;
  std::thread writer_;
};

/// PyTorch's dcp.async_save: a save through one process-wide AsyncCheckpointer with the
/// default coordinator, which waits at exit for the save in flight. Collective.
SaveFuture async_save(const ShardedStateDict& state, const ExtraState& extra,
                      const std::string& dir, const SaveOptions& options = {});

}  // namespace tdist::checkpoint

#pragma once

// How the ranks of a checkpoint save/load agree with each other. Every phase of a save ends
// with one all_gather of a small status message, so one rank's failure becomes every rank's
// error (never a hang), and the commit happens only after every rank reported success.
// Note [Checkpoint agreement]: every rank calls all_gather the same number of times in the
// same order, whatever failed locally; local errors travel inside the messages.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tdist/comm/process_group.h"
#include "tdist/store/store.h"
#include "tdist/store/store_all_gather.h"

namespace tdist::checkpoint {

class Coordinator {
 public:
  virtual ~Coordinator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// Every rank passes its message; every rank receives all messages in rank order.
  /// Throws TimeoutError (naming the missing ranks where it can) if a rank does not arrive.
  virtual std::vector<std::string> all_gather(const std::string& message) = 0;
};

using CoordinatorPtr = std::shared_ptr<Coordinator>;

/// World size 1: all_gather returns the message itself.
class LocalCoordinator : public Coordinator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::vector<std::string> all_gather(const std::string& message) override { return {message}; }
};

/// Agreement through a Store (TCPStore, FileStore, or a HashStore shared by rank threads).
/// `prefix` separates concurrent users of the same store; every rank must give the same one.
class StoreCoordinator : public Coordinator {
 public:
  StoreCoordinator(StorePtr store, int rank, int world_size, std::string prefix = "ckpt",
                   std::chrono::milliseconds timeout = std::chrono::minutes(5));
  int rank() const override { return gather_.rank(); }
  int world_size() const override { return gather_.world_size(); }
  std::vector<std::string> all_gather(const std::string& message) override;

 private:
  StorePtr store_;
  StoreAllGatherOptions gather_;
  uint64_t round_ = 0;
};

/// Agreement through a process group's collectives (tdist::all_gather); the group's timeout
/// bounds every call. A null group means the default (world) group.
class ProcessGroupCoordinator : public Coordinator {
 public:
  explicit ProcessGroupCoordinator(ProcessGroupPtr group = nullptr);
  int rank() const override;
  int world_size() const override;
  std::vector<std::string> all_gather(const std::string& message) override;
  const ProcessGroupPtr& group() const { return group_; }

 private:
  ProcessGroupPtr group_;
};

/// The coordinator save/load use when none is given: the default process group when
/// tdist::is_initialized(), else a LocalCoordinator (single process).
CoordinatorPtr default_coordinator();

/// The coordinator a background save uses when none is given (Note [Async save's agreement]
/// in async_save.h): a StoreCoordinator over the default group's store when
/// tdist::is_initialized(), else a LocalCoordinator.
CoordinatorPtr default_background_coordinator();

}  // namespace tdist::checkpoint

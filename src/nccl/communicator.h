#pragma once

// One NCCL communicator.
//
// Note [No NCCL call without a deadline]: the communicator is non-blocking
// (ncclConfig_t::blocking = 0), so no NCCL call can hold a thread past the group's timeout:
// initialisation and every call that answers ncclInProgress are waited out against a
// deadline, and past it the communicator is aborted. A rank that never arrives is then a
// TimeoutError, not a hang.

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "tdist/store/store.h"

namespace tdist::nccl::detail {

using Clock = std::chrono::steady_clock;

class Communicator {
 public:
  /// Collective over the group's ranks: rank 0 makes NCCL's unique id and shares it through
  /// `store`; returns once NCCL's initialisation finished on this rank. Past `timeout` it
  /// aborts and throws TimeoutError naming the ranks' likely problem.
  static std::unique_ptr<Communicator> create(Store& store, int rank, int size, int device,
                                              std::chrono::milliseconds timeout);
  /// ncclCommSplit of `parent`, collective over all of its ranks: this rank's communicator
  /// in the group of `color` at position `key`, or null for a rank in none (color < 0).
  /// Throws InvalidArgument when this NCCL has no split (before 2.18).
  static std::unique_ptr<Communicator> split(const Communicator& parent, int color, int key,
                                             std::chrono::milliseconds timeout);
  /// ncclCommShrink of `parent` without its ranks `excluded`, collective over the others.
  /// Throws InvalidArgument when this NCCL has no shrink (before 2.27).
  static std::unique_ptr<Communicator> shrink(const Communicator& parent, std::vector<int> excluded,
                                              int flags, std::chrono::milliseconds timeout);
  /// Whether this build's NCCL has ncclCommShrink.
  static bool can_shrink();
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// Held while NCCL calls use the communicator: abort() waits for the holders, and no lease
  /// is granted after it (DistBackendError), so no call reaches a freed communicator.
  using Lease = std::shared_lock<std::shared_mutex>;
  Lease lease() const;
  /// The communicator, for calls made under a lease.
  ncclComm_t get() const { return comm_; }
  int device() const { return device_; }

  /// Under a lease: waits while `result` is ncclInProgress (the call is still being set up),
  /// then throws DistBackendError for any error, TimeoutError past `deadline` (the caller,
  /// its lease released, aborts).
  void check(ncclResult_t result, const std::string& what, Clock::time_point deadline);

  /// NCCL's asynchronous error (a failed peer, a network error); ncclSuccess when none, or
  /// once aborted.
  ncclResult_t async_error() const;

  /// Aborts the communicator once (waiting for the leases held): kernels of it in flight
  /// return, later calls fail.
  void abort();
  bool aborted() const { return aborted_.load(); }

 private:
  Communicator(ncclComm_t comm, int device) : comm_(comm), device_(device) {}
  /// Waits out a split or shrink that made `comm` (null for a rank left out: then the
  /// parent's progress is polled); aborts and throws past `timeout`.
  static std::unique_ptr<Communicator> finish_derived(const Communicator& parent,
                                                      ncclResult_t result, ncclComm_t comm,
                                                      const std::string& what,
                                                      std::chrono::milliseconds timeout);
  ncclComm_t comm_;
  int device_;
  mutable std::shared_mutex mutex_;
  std::atomic<bool> aborted_{false};
};

}  // namespace tdist::nccl::detail

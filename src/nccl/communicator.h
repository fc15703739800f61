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
  ncclComm_t comm_;
  int device_;
  mutable std::shared_mutex mutex_;
  std::atomic<bool> aborted_{false};
};

}  // namespace tdist::nccl::detail

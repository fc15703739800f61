#pragma once

// The NCCL backend: collectives on CUDA tensors with c10d's stream semantics (docs/nccl.md).
// Built whenever the LibTorch has CUDA; registered as "nccl" for device type "cuda" in every
// program that links tdist::tdist (Note [Backend registration anchor]).

#include <chrono>
#include <string>
#include <tuple>

#include "tdist/arg.h"
#include "tdist/comm/collective_backend.h"
#include "tdist/store/store.h"

namespace tdist::nccl {

struct NCCLBackendOptions {
  /// The GPU this rank drives; -1: the process group's device_id, else LOCAL_RANK's GPU.
  TDIST_ARG(int, device_index) = -1;
  /// Work::wait() blocks the host until the collective is done, and raises its error there
  /// (TORCH_NCCL_BLOCKING_WAIT=1). Default: wait() only orders the caller's current stream.
  TDIST_ARG(bool, blocking_wait) = false;
  /// After a timeout or an asynchronous NCCL error, end the process (as c10d's
  /// TORCH_NCCL_ASYNC_ERROR_HANDLING, on unless it is 0): CUDA results of the failed
  /// collectives are undefined and code that does not block on them would go on computing.
  /// Off, or under blocking wait: the error is raised by Work::wait and by every later call.
  TDIST_ARG(bool, tear_down_on_error) = true;
  /// The communication stream at high priority (TORCH_NCCL_HIGH_PRIORITY=1).
  TDIST_ARG(bool, high_priority_stream) = false;
  /// How often the watchdog checks in-flight collectives for completion, timeout and NCCL's
  /// asynchronous errors (TDIST_NCCL_WATCHDOG_INTERVAL_MS).
  TDIST_ARG(std::chrono::milliseconds, watchdog_interval) = std::chrono::milliseconds(20);
};

/// NCCLBackendOptions from TORCH_NCCL_BLOCKING_WAIT, TORCH_NCCL_ASYNC_ERROR_HANDLING,
/// TORCH_NCCL_HIGH_PRIORITY and
/// TDIST_NCCL_WATCHDOG_INTERVAL_MS; a malformed value throws InvalidArgument naming it.
NCCLBackendOptions nccl_options_from_env();

/// Creates the backend of one group: every rank of it calls this together (the NCCL
/// communicator's unique id travels through `store`). Throws DistBackendError when this
/// process has no usable GPU, naming the fix.
CollectiveBackendPtr make_nccl_backend(const StorePtr& store, int rank, int size,
                                       std::chrono::milliseconds timeout,
                                       const NCCLBackendOptions& options = nccl_options_from_env());

/// The NCCL this build compiled against and the one loaded at run time (major, minor, patch).
std::tuple<int, int, int> nccl_version_compiled();
std::tuple<int, int, int> nccl_version_loaded();

/// Registers "nccl" (idempotent; runs before main() in programs linking tdist::tdist).
void register_nccl_backend();

}  // namespace tdist::nccl

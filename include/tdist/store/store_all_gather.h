#pragma once

// An all-gather of small byte strings through a Store, for ranks that have no host
// collective to agree with: checkpoint coordination over a bare store, and the
// TDIST_DEBUG=DETAIL check of a group whose backends take device tensors only.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tdist/arg.h"
#include "tdist/store/store.h"

namespace tdist {

/// Who takes part in a series of store all-gathers, under which keys, and for how long each
/// waits. Round r's keys are "<prefix>/<r>/<rank>".
struct StoreAllGatherOptions {
  /// Separates concurrent users of one store; every rank gives the same one.
  TDIST_ARG(std::string, prefix) = "all_gather";
  TDIST_ARG(int, rank) = 0;
  TDIST_ARG(int, world_size) = 1;
  TDIST_ARG(std::chrono::milliseconds, timeout) = Store::kDefaultTimeout;
  /// Names the caller in a timeout's message ("checkpoint", "signature check in group 'x'").
  TDIST_ARG(std::string, purpose) = "store all-gather";
};

/// Round `round` of an all-gather: sets this rank's value, waits for every rank's, returns
/// them in rank order. Every rank runs the same rounds, numbered one after another. This
/// rank's key of round-1 is deleted on the way out, so the store holds at most two rounds.
/// Throws TimeoutError naming the ranks that did not arrive within the timeout.
std::vector<std::vector<uint8_t>> store_all_gather(Store& store, uint64_t round,
                                                   const std::vector<uint8_t>& value,
                                                   const StoreAllGatherOptions& options);

/// The key of `rank`'s value in round `round` (for tests and callers that clean up).
std::string store_all_gather_key(const StoreAllGatherOptions& options, uint64_t round, int rank);

}  // namespace tdist

#pragma once

// FSDP's environment variables (docs/configuration.md, "FSDP"), parsed in one place.
// fully_shard (and materialize) read them once per call, so every group the call builds sees
// one set of values; they choose a collective's path, so they must match on every rank.

namespace tdist::fsdp::detail {

struct FSDPEnvironment {
  /// TDIST_FSDP_PERSISTENT_BUFFERS: groups that can use Note [Persistent buffers] do.
  bool persistent_buffers = true;
  /// TDIST_FSDP_SYMMETRIC, and symmetric memory is available here: flat shards and pooled
  /// buffers may live in symmetric memory (Note [Pooled blocks in symmetric memory]).
  bool symmetric_buffers = true;
  /// TDIST_FSDP_PLACED_ALL_GATHER: groups whose backend can gather straight into the
  /// unsharded block do (Note [Placed all-gather], tdist/detail/comm/placed_all_gather.h).
  bool placed_all_gather = true;

  /// Each variable is "1" (on, also when unset) or "0"; anything else raises
  /// InvalidArgument naming the variable and its value.
  static FSDPEnvironment from_env();
};

}  // namespace tdist::fsdp::detail

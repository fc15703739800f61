#pragma once

// The communication layer's environment variables (docs/configuration.md, "Debugging and
// failures"), parsed in one place. init_process_group parses them (a malformed value fails
// the init, naming the variable); the flight recorder and failure reports read what it
// parsed.

#include <chrono>
#include <cstddef>
#include <string>

namespace tdist::detail {

struct CommEnvironment {
  /// TDIST_DEBUG (or TORCH_DISTRIBUTED_DEBUG) is DETAIL: check every collective's
  /// signature across ranks first (OFF and INFO: no checks).
  bool debug_detail = false;
  /// TDIST_DEBUG is INFO or DETAIL: say once how the job was found (the launch environment).
  bool debug_info = false;
  /// TDIST_FLIGHT_RECORDER_SIZE: collectives the flight recorder keeps.
  size_t flight_recorder_size = 256;
  /// TDIST_FLIGHT_RECORDER_DIR: where a failure's dump goes (empty: the temp directory).
  std::string flight_recorder_dir;
  /// TDIST_FLIGHT_RECORDER_REPORT_WAIT_MS: how long a failing rank waits for its peers'
  /// reports (at most the group's timeout).
  std::chrono::milliseconds report_wait{2000};
  /// TDIST_HEARTBEAT_INTERVAL_MS: how often each rank beats (Note [Heartbeats] in
  /// comm/heartbeat.h); 0: no heartbeats.
  std::chrono::milliseconds heartbeat_interval{0};
  /// TDIST_HEARTBEAT_MISSES: missed intervals (at least 2) that make a rank lost.
  int heartbeat_misses = 5;
  /// TDIST_HEARTBEAT_GRACE_MS: how long a rank may go on after a loss interrupted its
  /// collectives before it is ended; negative (unset): the silence, interval x misses.
  std::chrono::milliseconds heartbeat_grace{-1};

  /// Raises InvalidArgument naming the variable and its value when one cannot be parsed.
  static CommEnvironment from_env();
};

/// What the last init_process_group parsed; parsed now when no init has run yet.
CommEnvironment comm_environment();
/// Parses the environment again (init_process_group) and returns it.
CommEnvironment reload_comm_environment();

}  // namespace tdist::detail

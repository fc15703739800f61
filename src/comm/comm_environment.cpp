#include "comm/comm_environment.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "tdist/detail/util/env.h"
#include "tdist/error.h"

namespace tdist::detail {

namespace {

const char* env_value(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// 0: OFF, 1: INFO, 2: DETAIL.
int parse_debug_level(const char* name, const char* value) {
  std::string level(value);
  std::transform(level.begin(), level.end(), level.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (level == "DETAIL") return 2;
  if (level == "INFO") return 1;
  if (level == "OFF") return 0;
  TDIST_THROW(InvalidArgument,
              std::string(name) + "='" + value + "' is not a debug level; use OFF, INFO or DETAIL");
}

std::mutex& mutex() {
  static std::mutex m;
  return m;
}

std::optional<CommEnvironment>& current() {
  static std::optional<CommEnvironment> env;
  return env;
}

}  // namespace

CommEnvironment CommEnvironment::from_env() {
  CommEnvironment env;
  int level = 0;
  if (const char* v = env_value("TDIST_DEBUG")) {
    level = parse_debug_level("TDIST_DEBUG", v);
  } else if (const char* torch = env_value("TORCH_DISTRIBUTED_DEBUG")) {
    level = parse_debug_level("TORCH_DISTRIBUTED_DEBUG", torch);
  }
  env.debug_info = level >= 1;
  env.debug_detail = level >= 2;
  if (auto n = util::env_integer("TDIST_FLIGHT_RECORDER_SIZE", 0, "a count >= 0")) {
    env.flight_recorder_size = static_cast<size_t>(*n);
  }
  if (const char* v = env_value("TDIST_FLIGHT_RECORDER_DIR")) env.flight_recorder_dir = v;
  if (auto ms = util::env_integer("TDIST_FLIGHT_RECORDER_REPORT_WAIT_MS", 0,
                                  "a number of milliseconds >= 0")) {
    env.report_wait = std::chrono::milliseconds(*ms);
  }
  if (auto ms = util::env_integer("TDIST_HEARTBEAT_INTERVAL_MS", 0,
                                  "a number of milliseconds >= 0 (0: no heartbeats)")) {
    env.heartbeat_interval = std::chrono::milliseconds(*ms);
  }
  if (auto n = util::env_integer("TDIST_HEARTBEAT_MISSES", 2, "a count >= 2")) {
    TDIST_CHECK_ARG(*n <= 1000000, "TDIST_HEARTBEAT_MISSES='" + std::to_string(*n) +
                                       "': expected a count from 2 to 1000000");
    env.heartbeat_misses = static_cast<int>(*n);
  }
  if (auto ms = util::env_integer("TDIST_HEARTBEAT_GRACE_MS", 0, "a number of milliseconds >= 0")) {
    env.heartbeat_grace = std::chrono::milliseconds(*ms);
  }
  return env;
}

CommEnvironment comm_environment() {
  std::lock_guard<std::mutex> lock(mutex());
  if (!current()) current() = CommEnvironment::from_env();
  return *current();
}

CommEnvironment reload_comm_environment() {
  CommEnvironment env = CommEnvironment::from_env();
  std::lock_guard<std::mutex> lock(mutex());
  current() = env;
  return env;
}

}  // namespace tdist::detail

#include "fsdp/environment.h"

#include <cstdlib>
#include <string>

#include "tdist/comm/symmetric_memory.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {

namespace {

// An on/off switch that is on when unset: "1" on, "0" off, anything else raises.
bool switched_on(const char* name) {
  const char* env = std::getenv(name);
  if (env == nullptr || std::string(env) == "1") return true;
  if (std::string(env) == "0") return false;
  TDIST_THROW(InvalidArgument,
              std::string(name) + "='" + env + "': expected 0 (off) or 1 (on, the default)");
}

}  // namespace

FSDPEnvironment FSDPEnvironment::from_env() {
  FSDPEnvironment env;
  env.persistent_buffers = switched_on("TDIST_FSDP_PERSISTENT_BUFFERS");
  env.symmetric_buffers = switched_on("TDIST_FSDP_SYMMETRIC") && symmetric_memory::is_available();
  env.placed_all_gather = switched_on("TDIST_FSDP_PLACED_ALL_GATHER");
  return env;
}

}  // namespace tdist::fsdp::detail

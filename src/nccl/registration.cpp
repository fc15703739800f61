// "nccl" in the backend registry, and its options from the environment.

#include <cstdlib>
#include <mutex>

#include "tdist/comm/backend.h"
#include "tdist/error.h"
#include "tdist/nccl/nccl_backend.h"

namespace tdist::nccl {

namespace {

bool env_flag(const char* name, bool fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  const std::string v(value);
  if (v == "0" || v == "false" || v == "False") return false;
  if (v == "1" || v == "true" || v == "True") return true;
  TDIST_THROW(InvalidArgument, std::string(name) + "='" + v + "' is not 0 or 1");
}

/// TORCH_NCCL_ASYNC_ERROR_HANDLING as c10d reads it: 1 (tear down) and 3 (skip clean-up, the
/// default) end the process after a failure; 0 (none) and 2 (clean up only) leave it running
/// to raise. The communicator is aborted in every mode here.
bool ends_process_on_error() {
  const char* value = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  if (value == nullptr || *value == '\0') return true;
  const std::string v(value);
  if (v == "1" || v == "3") return true;
  if (v == "0" || v == "2") return false;
  TDIST_THROW(InvalidArgument, "TORCH_NCCL_ASYNC_ERROR_HANDLING='" + v +
                                   "' is not 0 (raise only), 1 (end the process), 2 (clean up "
                                   "and raise) or 3 (end the process, the default)");
}

}  // namespace

NCCLBackendOptions nccl_options_from_env() {
  NCCLBackendOptions options;
  options.blocking_wait(env_flag("TORCH_NCCL_BLOCKING_WAIT", false));
  options.tear_down_on_error(ends_process_on_error());
  options.high_priority_stream(env_flag("TORCH_NCCL_HIGH_PRIORITY", false));
  if (const char* value = std::getenv("TDIST_NCCL_WATCHDOG_INTERVAL_MS")) {
    char* end = nullptr;
    const long ms = std::strtol(value, &end, 10);
    if (end == value || *end != '\0' || ms <= 0 || ms > 60000) {
      TDIST_THROW(InvalidArgument, std::string("TDIST_NCCL_WATCHDOG_INTERVAL_MS='") + value +
                                       "' is not a number of milliseconds in [1, 60000]");
    }
    options.watchdog_interval(std::chrono::milliseconds(ms));
  }
  return options;
}

void register_nccl_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (tdist::detail::backend_registered("nccl")) return;
    Backend::register_backend(
        "nccl",
        [](const StorePtr& store, int rank, int size, std::chrono::milliseconds timeout) {
          return make_nccl_backend(store, rank, size, timeout);
        },
        /*extended_api=*/true, {"cuda"});
  });
}

}  // namespace tdist::nccl

// See Note [Backend registration anchor] in src/mpi/registration.cpp.
extern "C" {
int tdist_nccl_registration_anchor = 0;
}
namespace {
const bool kRegistered = [] {
  tdist::nccl::register_nccl_backend();
  return true;
}();
}  // namespace

// GlooBackend: construction, lazy connect, the work lanes, failure handling, env options.
// The collectives themselves live in collectives_*.cpp.

#include "tdist/gloo/gloo_backend.h"

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>

#include "gloo/gloo_comm.h"
#include "gloo/work_queue.h"
#include "tdist/detail/util/best_effort.h"
#include "tdist/error.h"

namespace tdist::gloo {

namespace {

constexpr const char* kFailureKey = "gloo/first_failure";

// Rebuilds `error` with `extra` appended to its message, keeping its type.
std::exception_ptr with_context(std::exception_ptr error, const std::string& extra) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    return std::make_exception_ptr(TimeoutError(e.what() + extra));
  } catch (const NetworkError& e) {
    return std::make_exception_ptr(NetworkError(e.what() + extra));
  } catch (const DistBackendError& e) {
    return std::make_exception_ptr(DistBackendError(e.what() + extra));
  } catch (...) {
    return error;
  }
}

enum class Severity { kNone, kBroken, kClose };

// Timeouts and lost peers leave the connections in an unknown state: close them so that
// peers fail fast too. A mismatch found by the header handshake leaves them in step (no
// payload was posted), so the group is only marked broken.
Severity severity_of(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
    return Severity::kClose;
  } catch (const NetworkError&) {
    return Severity::kClose;
  } catch (const DistBackendError&) {
    return Severity::kBroken;
  } catch (...) {
    return Severity::kNone;
  }
}

// Note [Best-effort store calls] in tdist/detail/util/best_effort.h.
constexpr auto kStoreCallBudget = std::chrono::seconds(2);

template <typename T>
std::optional<T> best_effort(std::function<T()> call) {
  return detail::best_effort<T>(std::move(call), kStoreCallBudget);
}

}  // namespace

GlooBackend::GlooBackend(StorePtr store, int rank, int size, std::chrono::milliseconds timeout,
                         GlooBackendOptions options)
    : CollectiveBackend(rank, size),
      store_(std::move(store)),
      timeout_(timeout),
      options_(std::move(options)) {
  TDIST_CHECK_ARG(store_ != nullptr, "GlooBackend: store must not be null");
  TDIST_CHECK_ARG(size >= 1, "GlooBackend: world size must be >= 1, got " + std::to_string(size));
  TDIST_CHECK_ARG(rank >= 0 && rank < size, "GlooBackend: rank " + std::to_string(rank) +
                                                " is outside [0, " + std::to_string(size) + ")");
  TDIST_CHECK_ARG(timeout.count() > 0, "GlooBackend: timeout must be positive, got " +
                                           std::to_string(timeout.count()) + " ms");
  if (!options_.lazy_init()) comm();
  auto on_error = [this](std::exception_ptr error) {
    switch (severity_of(error)) {
      case Severity::kClose:
        fail(message_of(error));
        break;
      case Severity::kBroken:
        mark_broken(message_of(error));
        break;
      case Severity::kNone:
        break;
    }
  };
  collective_queue_ = std::make_unique<detail::GlooWorkQueue>(on_error);
  send_queue_ = std::make_unique<detail::GlooWorkQueue>(on_error);
  recv_queue_ = std::make_unique<detail::GlooWorkQueue>(on_error);
}

GlooBackend::~GlooBackend() {
  // A lane stuck on a peer that never comes would hold the destructor for the whole timeout:
  // close the connections so that it fails at once. Idle lanes keep the soft close, which
  // lets the last bytes reach the peers.
  bool busy = collective_queue_->busy() || send_queue_->busy() || recv_queue_->busy();
  if (busy) {
    mark_broken("the gloo backend of rank " + std::to_string(rank_) + " was destroyed");
    std::lock_guard<std::mutex> lock(connect_mutex_);
    if (comm_) comm_->close();
  }
  collective_queue_.reset();
  send_queue_.reset();
  recv_queue_.reset();
}

detail::GlooComm& GlooBackend::comm() {
  std::lock_guard<std::mutex> lock(connect_mutex_);
  if (!comm_) comm_ = std::make_shared<detail::GlooComm>(*store_, rank_, size_, timeout_, options_);
  return *comm_;
}

bool GlooBackend::uses_shared_memory() {
  return comm().shm() != nullptr;
}

std::chrono::milliseconds GlooBackend::effective_timeout(const CollectiveOptions& opts) const {
  return opts.timeout.count() > 0 ? opts.timeout : timeout_;
}

void GlooBackend::close_connections() {
  std::shared_ptr<detail::GlooComm> comm;
  {
    std::lock_guard<std::mutex> lock(connect_mutex_);
    comm = comm_;
  }
  if (comm) comm->close();
}

bool GlooBackend::abort(const std::string& reason) {
  mark_broken(reason);
  close_connections();
  return true;
}

void GlooBackend::fail(const std::string& reason) {
  mark_broken(reason);
  // Record the first failure in the group so that ranks that only see the cascade (a closed
  // connection to a live rank) can name the original cause. Best effort: the store may be
  // gone with the peer that hosted it (Note [Best-effort store calls]).
  best_effort<bool>([store = store_, reason] {
    store->compare_set(kFailureKey, {}, std::vector<uint8_t>(reason.begin(), reason.end()));
    return true;
  });
  close_connections();
}

WorkPtr GlooBackend::enqueue(Lane lane, const std::string& op, std::vector<at::Tensor> outputs,
                             std::function<void()> body) {
  check_not_broken(op);
  auto work = std::make_shared<Work>(op, std::move(outputs));
  auto wrapped = [this, op, body = std::move(body)]() {
    check_not_broken(op);
    try {
      body();
    } catch (const std::exception& e) {
      // Aborted, or broken by another lane's failure, while it waited: that is the cause,
      // not the closed connection it saw (Note [Aborting on a lost peer]).
      if (is_broken()) {
        TDIST_THROW(DistBackendError, "rank " + std::to_string(rank_) + ": gloo " + op +
                                          " was interrupted: the process group is broken (" +
                                          broken_reason() + ")");
      }
      if (dynamic_cast<const NetworkError*>(&e) == nullptr) throw;
      // Name the first failure in the group when this rank only saw its cascade.
      const std::string first =
          best_effort<std::string>([store = store_] {
            return store->check({kFailureKey}) ? store->get_string(kFailureKey) : std::string();
          }).value_or("");
      auto error = std::current_exception();
      if (!first.empty() && message_of(error).find(first) == std::string::npos) {
        std::rethrow_exception(with_context(error, "; first failure in the group: " + first));
      }
      throw;
    }
  };
  auto& queue = lane == Lane::kSend   ? send_queue_
                : lane == Lane::kRecv ? recv_queue_
                                      : collective_queue_;
  queue->push(work, std::move(wrapped));
  return work;
}

GlooBackendOptions gloo_options_from_env() {
  GlooBackendOptions options;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    std::vector<std::string> names;
    std::stringstream ss(ifname);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (!item.empty()) names.push_back(item);
    }
    options.interfaces(names);
  }
  if (const char* host = std::getenv("MASTER_ADDR"); host && *host) options.store_host(host);
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const char* world = std::getenv("WORLD_SIZE");
  if (local && *local && world && *world) options.single_host(std::string(local) == world);
  if (const char* lazy = std::getenv("TORCH_GLOO_LAZY_INIT"); lazy && *lazy) {
    std::string v(lazy);
    options.lazy_init(v == "1" || v == "true" || v == "TRUE" || v == "True");
  }
  if (const char* channels = std::getenv("TDIST_GLOO_CHANNELS"); channels && *channels) {
    char* end = nullptr;
    long n = std::strtol(channels, &end, 10);
    TDIST_CHECK_ARG(
        end && *end == '\0' && n >= 1 && n <= 16,
        std::string("TDIST_GLOO_CHANNELS must be an integer in [1, 16], got '") + channels + "'");
    options.channels(static_cast<int>(n));
  }
  if (const char* shm = std::getenv("TDIST_GLOO_SHM"); shm && *shm) {
    std::string v(shm);
    TDIST_CHECK_ARG(v == "0" || v == "1",
                    "TDIST_GLOO_SHM must be 0 (TCP only) or 1 (shared memory between ranks on "
                    "one host), got '" +
                        v + "'");
    options.shared_memory(v == "1");
  }
  if (const char* max = std::getenv("TDIST_GLOO_SHM_MAX_BYTES"); max && *max) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(max, &end, 10);
    TDIST_CHECK_ARG(
        errno == 0 && end && *end == '\0' && max[0] != '-',
        "TDIST_GLOO_SHM_MAX_BYTES must be a number of bytes, got '" + std::string(max) + "'");
    options.shared_memory_max_bytes(static_cast<size_t>(v));
  }
  return options;
}

CollectiveBackendPtr make_gloo_backend(const StorePtr& store, int rank, int size,
                                       std::chrono::milliseconds timeout) {
  return std::make_shared<GlooBackend>(store, rank, size, timeout, gloo_options_from_env());
}

}  // namespace tdist::gloo

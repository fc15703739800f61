#include "gloo/gloo_comm.h"

#include <signal.h>
#include <unistd.h>

#include "gloo/device_address.h"
#include "gloo/shm.h"
#include "tdist/error.h"

namespace tdist::detail {

namespace {

// The transport's rendezvous store on top of a tdist Store.
class StoreAdapter final : public gloo_transport::KeyValueStore {
 public:
  explicit StoreAdapter(tdist::Store& store) : store_(store) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_.get(key);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    store_.wait(keys, timeout);
  }

 private:
  tdist::Store& store_;
};

// Slot of the liveness probes (see Note [Dead-peer watchdog]); no payload is ever sent there.
constexpr uint64_t kProbeSlot = (uint64_t(1) << 62) + 7;

std::unique_ptr<gloo_transport::Context> connect_channel(gloo_transport::Module& module,
                                                         const gloo_transport::DeviceAddress& where,
                                                         StoreAdapter& store, int channel, int rank,
                                                         int size,
                                                         std::chrono::milliseconds timeout) {
  using gloo_transport::TransportError;
  const std::string who = "rank " + std::to_string(rank);
  try {
    return module.connect(where, store, "gloo/ch" + std::to_string(channel), rank, size, timeout);
  } catch (const TransportError& e) {
    if (e.kind() == TransportError::Kind::kDevice && !where.interface.empty()) {
      TDIST_THROW(InvalidArgument, who + ": gloo cannot use network interface '" + where.interface +
                                       "' (GLOO_SOCKET_IFNAME): " + e.what() +
                                       "; list interfaces with `ip link`");
    }
    if (e.kind() == TransportError::Kind::kDevice) {
      TDIST_THROW(NetworkError, who + ": gloo cannot bind address " + where.address + ": " +
                                    e.what() + "; set GLOO_SOCKET_IFNAME to the interface to use");
    }
    if (e.kind() == TransportError::Kind::kIo) {
      TDIST_THROW(NetworkError, who + ": gloo could not connect to its peers within " +
                                    std::to_string(timeout.count()) + " ms: " + e.what() +
                                    "; check that every rank started and that the network "
                                    "(GLOO_SOCKET_IFNAME) is reachable");
    }
    TDIST_THROW(DistBackendError, who + ": gloo connect failed: " + e.what());
  } catch (const tdist::Error&) {
    throw;  // the store's own (a peer that never wrote its address: TimeoutError)
  } catch (const std::exception& e) {
    TDIST_THROW(DistBackendError, who + ": gloo connect failed: " + e.what());
  }
}

// Note [SIGPIPE]: libgloo writes to its sockets with writev(), which raises SIGPIPE in the
// writing process when a peer has died, and SIGPIPE's default action kills it: the survivor
// would die with the victim instead of getting the NetworkError that names it. Python
// ignores SIGPIPE at start-up, so c10d never meets this; a C++ program does. Ignore it then,
// but only when nobody chose a disposition: a program's own handler stays.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
}

}  // namespace

GlooComm::GlooComm(Store& store, int rank, int size, std::chrono::milliseconds timeout,
                   const gloo::GlooBackendOptions& options)
    : rank_(rank), size_(size), segment_bytes_(std::max<size_t>(options.segment_bytes(), 4096)) {
  ignore_sigpipe_unless_handled();
  const int channels = std::max(1, options.channels());
  gloo_transport::Module& module = gloo_transport::module();
  StoreAdapter adapter(store);
  const auto addresses = choose_device_addresses(options, channels, rank);
  for (int c = 0; c < channels; ++c)
    contexts_.push_back(connect_channel(module, addresses[c], adapter, c, rank, size, timeout));
  for (auto& context : contexts_) probes_.push_back(context->buffer(&probe_byte_, 1));
  if (options.shared_memory()) {
    shm_ = ShmArena::connect(store, rank, size, timeout, options.shared_memory_max_bytes());
  }
  watchdog_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(watch_mutex_);
    while (!stop_watchdog_) {
      watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
      for (Waiter* w : waiters_) {
        if (w->aborted || !peer_error(w->peer)) continue;
        w->aborted = true;
        if (w->is_send) {
          w->buffer->abort_wait_send();
        } else {
          w->buffer->abort_wait_recv();
        }
      }
    }
  });
}

GlooComm::~GlooComm() {
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    stop_watchdog_ = true;
  }
  watch_cv_.notify_all();
  watchdog_.join();
}

std::exception_ptr GlooComm::peer_error(int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_) return nullptr;
  // libgloo keeps a connection's error private (and its headers give no way to reach it), but
  // posting on a failed connection rethrows that error: a zero-byte receive on a slot nobody sends
  // to is the probe. Each live probe leaves one small entry on both ends.
  for (size_t c = 0; c < contexts_.size(); ++c) {
    try {
      probes_[c]->recv(peer, kProbeSlot, 0, 0);
    } catch (...) {
      return std::current_exception();
    }
  }
  return nullptr;
}

void GlooComm::watch(Waiter* waiter) {
  std::lock_guard<std::mutex> lock(watch_mutex_);
  waiters_.insert(waiter);
}

void GlooComm::unwatch(Waiter* waiter) {
  std::lock_guard<std::mutex> lock(watch_mutex_);
  waiters_.erase(waiter);
}

std::unique_ptr<gloo_transport::Buffer> GlooComm::buffer(int channel, void* ptr, size_t bytes) {
  return contexts_[channel % contexts_.size()]->buffer(ptr, bytes);
}

char* GlooComm::scratch(int slot, size_t bytes) {
  if (static_cast<int>(scratch_.size()) <= slot) {
    scratch_.resize(slot + 1);
    scratch_bytes_.resize(slot + 1, 0);
  }
  bytes = std::max<size_t>(bytes, 1);
  if (scratch_bytes_[slot] < bytes) {
    scratch_[slot].reset(new char[bytes]);
    scratch_bytes_[slot] = bytes;
  }
  return scratch_[slot].get();
}

void GlooComm::close() {
  for (auto& context : contexts_) {
    try {
      context->close_connections();
    } catch (...) {
      // Closing is best effort: the connections may already be gone.
    }
  }
}

}  // namespace tdist::detail

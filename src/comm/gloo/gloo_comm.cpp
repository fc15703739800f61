#include "comm/gloo/gloo_comm.h"

#include <signal.h>
#include <unistd.h>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "comm/gloo/shm.h"
#include "tdist/error.h"

namespace tdist::detail {

namespace {

// gloo's rendezvous store interface on top of a tdist Store.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(tdist::Store& store, std::chrono::milliseconds timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    store_.wait({key}, timeout_);
    auto value = store_.get(key);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, timeout);
  }

 private:
  tdist::Store& store_;
  std::chrono::milliseconds timeout_;
};

// Slot of the liveness probes (see Note [Dead-peer watchdog]); no payload is ever sent there.
constexpr uint64_t kProbeSlot = (uint64_t(1) << 62) + 7;

std::string default_hostname() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "127.0.0.1";
  return name;
}

std::shared_ptr<gloo::transport::Device> make_device(const GlooBackendOptions& options, int channel,
                                                     int rank) {
  gloo::transport::tcp::attr attr;
  if (!options.interfaces().empty()) {
    attr.iface = options.interfaces()[channel % options.interfaces().size()];
    try {
      return gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      TDIST_THROW(InvalidArgument, "rank " + std::to_string(rank) +
                                       ": gloo cannot use network interface '" + attr.iface +
                                       "' (GLOO_SOCKET_IFNAME): " + e.what() +
                                       "; list interfaces with `ip link`");
    }
  }
  if (!options.hostname().empty()) {
    attr.hostname = options.hostname();
    return gloo::transport::tcp::CreateDevice(attr);
  }
  // As c10d: the address the host name resolves to if it can be bound, else loopback.
  try {
    attr.hostname = default_hostname();
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception&) {
    attr.hostname = "127.0.0.1";
    return gloo::transport::tcp::CreateDevice(attr);
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
                   const GlooBackendOptions& options)
    : rank_(rank), size_(size), segment_bytes_(std::max<size_t>(options.segment_bytes(), 4096)) {
  ignore_sigpipe_unless_handled();
  const int channels = std::max(1, options.channels());
  StoreAdapter adapter(store, timeout);
  for (int c = 0; c < channels; ++c) {
    auto device = make_device(options, c, rank);
    gloo::rendezvous::PrefixStore prefixed("gloo/ch" + std::to_string(c), adapter);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    try {
      context->connectFullMesh(prefixed, device);
    } catch (const tdist::Error&) {
      throw;
    } catch (const gloo::IoException& e) {
      TDIST_THROW(NetworkError, "rank " + std::to_string(rank) +
                                    ": gloo could not connect to its peers within " +
                                    std::to_string(timeout.count()) + " ms: " + e.what() +
                                    "; check that every rank started and that the network "
                                    "(GLOO_SOCKET_IFNAME) is reachable");
    } catch (const std::exception& e) {
      TDIST_THROW(DistBackendError,
                  "rank " + std::to_string(rank) + ": gloo connect failed: " + e.what());
    }
    contexts_.push_back(std::move(context));
  }
  for (auto& context : contexts_) probes_.push_back(context->createUnboundBuffer(&probe_byte_, 1));
  if (options.shared_memory()) shm_ = ShmArena::connect(store, rank, size, timeout);
  watchdog_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(watch_mutex_);
    while (!stop_watchdog_) {
      watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
      for (Waiter* w : waiters_) {
        if (w->aborted || !peer_error(w->peer)) continue;
        w->aborted = true;
        if (w->is_send) {
          w->buffer->abortWaitSend();
        } else {
          w->buffer->abortWaitRecv();
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
  // libgloo keeps a connection's error private (and Debian's gloo headers cannot be used to
  // reach it), but posting on a failed connection rethrows that error: a zero-byte receive on
  // a slot nobody sends to is the probe. Each live probe leaves one small entry on both ends.
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

std::unique_ptr<gloo::transport::UnboundBuffer> GlooComm::buffer(int channel, void* ptr,
                                                                 size_t bytes) {
  return contexts_[channel % contexts_.size()]->createUnboundBuffer(ptr, bytes);
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
      context->closeConnections();
    } catch (...) {
      // Closing is best effort: the connections may already be gone.
    }
  }
}

}  // namespace tdist::detail

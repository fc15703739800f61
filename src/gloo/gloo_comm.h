#pragma once

// The connected Gloo group: one gloo context per channel (each on its own device, so each
// has its own I/O thread and TCP connection per peer), the rendezvous through a tdist Store,
// and the collective sequence counter.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gloo/transport/transport.h"
#include "tdist/gloo/gloo_backend.h"
#include "tdist/store/store.h"

namespace tdist::detail {

class ShmArena;

class GlooComm {
 public:
  /// Connects the full mesh on every channel; throws TimeoutError/NetworkError naming the
  /// ranks that did not show up.
  GlooComm(Store& store, int rank, int size, std::chrono::milliseconds timeout,
           const gloo::GlooBackendOptions& options);
  ~GlooComm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int channels() const { return static_cast<int>(contexts_.size()); }
  size_t segment_bytes() const { return segment_bytes_; }

  std::unique_ptr<gloo_transport::Buffer> buffer(int channel, void* ptr, size_t bytes);

  /// Sequence number of the next collective (1, 2, ...); all ranks count alike.
  uint64_t next_seq() { return ++seq_; }

  /// Grow-only scratch buffer `slot` of at least `bytes` bytes, kept across collectives so
  /// that large ones do not page-fault fresh memory each time. Collective lane only.
  char* scratch(int slot, size_t bytes);

  /// The error of a failed connection to `peer` on any channel, else nullptr.
  std::exception_ptr peer_error(int peer);

  // Note [Dead-peer watchdog]: libgloo only signals a failed connection to the operations
  // still queued on it, not to a receive whose payload is half read when the peer dies, so
  // that wait would run into the timeout. While a wait is registered here, a watchdog thread
  // probes the peer's connections every 100 ms and aborts the wait when one has failed.
  struct Waiter {
    gloo_transport::Buffer* buffer = nullptr;
    int peer = -1;
    bool is_send = false;
    std::atomic<bool> aborted{false};
  };
  void watch(Waiter* waiter);
  void unwatch(Waiter* waiter);

  /// The same-host shared-memory arena (Note [Shared-memory path]); nullptr when the ranks
  /// are not all on this host or it is turned off.
  ShmArena* shm() { return shm_.get(); }

  /// Hard-closes every connection so that peers blocked on this rank fail at once.
  void close();

 private:
  int rank_;
  int size_;
  size_t segment_bytes_;
  std::vector<std::unique_ptr<gloo_transport::Context>> contexts_;
  std::atomic<uint64_t> seq_{0};
  std::vector<std::unique_ptr<char[]>> scratch_;
  std::vector<size_t> scratch_bytes_;
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  std::set<Waiter*> waiters_;
  bool stop_watchdog_ = false;
  std::thread watchdog_;
  char probe_byte_ = 0;
  std::vector<std::unique_ptr<gloo_transport::Buffer>> probes_;
  std::unique_ptr<ShmArena> shm_;
};

}  // namespace tdist::detail

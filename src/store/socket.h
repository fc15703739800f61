#pragma once

// Small POSIX socket helpers for the TCP store: every call has a deadline.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace tdist::detail {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

/// now + timeout; timeout <= 0 means no deadline.
Deadline deadline_after(std::chrono::milliseconds timeout);

/// Closes the fd on scope exit.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

/// A non-blocking listening socket bound to exactly `address` (numeric or a host name).
/// Throws StoreError naming the port when it is already in use.
Socket listen_on(const std::string& address, int port, int* bound_port);

/// Called once when a connection attempt is still retrying after `after`.
struct SlowConnectNotice {
  std::chrono::milliseconds after{0};  // 0: never
  std::function<void(std::chrono::milliseconds waited)> say;
};

/// Connects to host:port, retrying refused/unreachable attempts until the deadline, then
/// throws StoreError naming host:port and the timeout.
Socket connect_with_retry(const std::string& host, int port, std::chrono::milliseconds timeout,
                          const SlowConnectNotice& notice = {});

/// "250 ms", "5 s", "30 min": a duration as a person would write it.
std::string duration_text(std::chrono::milliseconds d);

/// Sends or receives exactly `size` bytes before the deadline; throws StoreError if the peer
/// closed or failed, TimeoutError past the deadline. `what` names the operation in messages.
void send_all(int fd, const void* data, size_t size, Deadline deadline, const std::string& what);
void recv_all(int fd, void* data, size_t size, Deadline deadline, const std::string& what);

void set_non_blocking(int fd, bool on);

/// "host:port" of the local end of a socket.
std::string local_address(int fd);

}  // namespace tdist::detail

#include "store/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "tdist/error.h"

namespace tdist::detail {

Deadline deadline_after(std::chrono::milliseconds timeout) {
  // Absurd timeouts (e.g. from a hostile client) mean "none", never an overflowed clock.
  constexpr auto kForever = std::chrono::hours(24 * 365 * 10);
  if (timeout.count() <= 0 || timeout > kForever) return Deadline::max();
  return Clock::now() + timeout;
}

void Socket::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void set_non_blocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

namespace {

std::string errno_text(int err) {
  return std::string(std::strerror(err));
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list != nullptr) ::freeaddrinfo(list);
  }
};

int resolve(const std::string& host, int port, bool passive, AddrInfo* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  return ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->list);
}

int poll_one(int fd, short events, Deadline deadline) {
  while (true) {
    int wait_ms = -1;
    if (deadline != Deadline::max()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return 0;
      wait_ms = static_cast<int>(std::min<int64_t>(left.count() + 1, 60000));
    }
    pollfd pfd{fd, events, 0};
    int rc = ::poll(&pfd, 1, wait_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0 && deadline == Deadline::max()) continue;
    if (rc == 0 && Clock::now() < deadline) continue;
    return rc;
  }
}

}  // namespace

Socket listen_on(const std::string& address, int port, int* bound_port) {
  AddrInfo addrs;
  if (int rc = resolve(address, port, true, &addrs); rc != 0) {
    TDIST_THROW(StoreError, "TCPStore: cannot resolve the bind address '" + address + "': " +
                                ::gai_strerror(rc) + "; pass a numeric address such as 127.0.0.1");
  }
  int last_errno = 0;
  for (addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
    Socket sock(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!sock.valid()) {
      last_errno = errno;
      continue;
    }
    // Lets a restarted job rebind while old connections linger in TIME_WAIT; on Linux it
    // does not allow two listeners on one port, so "port in use" is still detected.
    int one = 1;
    ::setsockopt(sock.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a->ai_family == AF_INET6) ::setsockopt(sock.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &one, 4);
    if (::bind(sock.fd(), a->ai_addr, a->ai_addrlen) != 0) {
      last_errno = errno;
      if (last_errno == EADDRINUSE) {
        TDIST_THROW(StoreError,
                    "TCPStore: port " + std::to_string(port) + " on " + address +
                        " is already in use (another job, or a process from an earlier run, "
                        "still holds it); choose another MASTER_PORT or stop that process");
      }
      continue;
    }
    if (::listen(sock.fd(), 1024) != 0) {
      last_errno = errno;
      continue;
    }
    set_non_blocking(sock.fd(), true);
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    ::getsockname(sock.fd(), reinterpret_cast<sockaddr*>(&local), &len);
    *bound_port = local.ss_family == AF_INET6
                      ? ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port)
                      : ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
    return sock;
  }
  TDIST_THROW(StoreError, "TCPStore: cannot listen on " + address + ":" + std::to_string(port) +
                              ": " + errno_text(last_errno) +
                              "; check that the address belongs to this machine");
}

std::string duration_text(std::chrono::milliseconds d) {
  const auto ms = d.count();
  if (ms != 0 && ms % 60000 == 0) return std::to_string(ms / 60000) + " min";
  if (ms != 0 && ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

Socket connect_with_retry(const std::string& host, int port, std::chrono::milliseconds timeout,
                          const SlowConnectNotice& notice) {
  const auto start = Clock::now();
  const Deadline deadline = deadline_after(timeout);
  bool noticed = notice.after.count() <= 0 || !notice.say;
  const std::string where = host + ":" + std::to_string(port);
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(10);
  while (true) {
    AddrInfo addrs;
    if (int rc = resolve(host, port, false, &addrs); rc != 0) {
      last_error = std::string("cannot resolve host: ") + ::gai_strerror(rc);
    } else {
      for (addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
        Socket sock(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
        if (!sock.valid()) continue;
        set_non_blocking(sock.fd(), true);
        int rc = ::connect(sock.fd(), a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          // Bound each attempt so a silently dropped SYN does not eat the whole timeout.
          auto attempt = std::min(deadline, Clock::now() + std::chrono::seconds(2));
          if (poll_one(sock.fd(), POLLOUT, attempt) > 0) {
            int err = 0;
            socklen_t len = sizeof(err);
            ::getsockopt(sock.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
            rc = err == 0 ? 0 : -1;
            errno = err;
          } else {
            errno = ETIMEDOUT;
          }
        }
        if (rc == 0) {
          set_non_blocking(sock.fd(), false);
          int one = 1;
          ::setsockopt(sock.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          return sock;
        }
        last_error = errno_text(errno);
      }
    }
    if (Clock::now() + backoff >= deadline) break;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    if (!noticed && waited >= notice.after) {
      noticed = true;
      notice.say(waited);
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  TDIST_THROW(StoreError, "could not connect to the store at " + where + " within " +
                              duration_text(timeout) + " (last error: " + last_error +
                              ") — is rank 0 running and are MASTER_ADDR/MASTER_PORT right?");
}

void send_all(int fd, const void* data, size_t size, Deadline deadline, const std::string& what) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    int ready = poll_one(fd, POLLOUT, deadline);
    if (ready == 0) TDIST_THROW(TimeoutError, what + ": timed out sending to the store");
    if (ready < 0) TDIST_THROW(StoreError, what + ": poll failed: " + errno_text(errno));
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      TDIST_THROW(StoreError, what + ": connection to the store lost: " + errno_text(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void recv_all(int fd, void* data, size_t size, Deadline deadline, const std::string& what) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    int ready = poll_one(fd, POLLIN, deadline);
    if (ready == 0) TDIST_THROW(TimeoutError, what + ": timed out waiting for the store");
    if (ready < 0) TDIST_THROW(StoreError, what + ": poll failed: " + errno_text(errno));
    ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
    if (n == 0) TDIST_THROW(StoreError, what + ": the store closed the connection");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      TDIST_THROW(StoreError, what + ": connection to the store lost: " + errno_text(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

std::string local_address(int fd) {
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return "?";
  char text[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (local.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&local);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    port = ntohs(a->sin6_port);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&local);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    port = ntohs(a->sin_port);
  }
  return std::string(text) + ":" + std::to_string(port);
}

}  // namespace tdist::detail

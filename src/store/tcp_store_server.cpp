#include "store/tcp_store_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <iostream>
#include <unordered_map>

#include "store/reserved_keys.h"
#include "store/store_auth.h"
#include "tdist/error.h"

namespace tdist::detail {

namespace {

using store_proto::Op;
using store_proto::Request;
using store_proto::Status;

// A client that has not authenticated within this time is disconnected, so idle or slow
// unauthenticated connections cannot pile up.
constexpr auto kHandshakeTimeout = std::chrono::seconds(30);
// Bytes read from one connection per poll round: keeps service fair between clients.
constexpr size_t kReadChunk = 256 * 1024;
// Stop reading requests from a client that does not read its responses.
constexpr size_t kMaxPendingOutput = 64 * 1024 * 1024;
constexpr size_t kMaxConnections = 4096;

struct Connection {
  Socket sock;
  std::vector<uint8_t> in;
  std::vector<uint8_t> out;
  size_t out_pos = 0;
  bool authenticated = false;
  std::vector<uint8_t> server_nonce;
  Deadline handshake_deadline = Deadline::max();
  // A parked get/wait/multi_get/queue pop: served when it can be or its deadline passes.
  bool parked = false;
  Request pending;
  Deadline pending_deadline = Deadline::max();
  bool close_now = false;
};

std::vector<uint8_t> bytes_of(const std::string& s) {
  return {s.begin(), s.end()};
}

bool parse_int(const std::vector<uint8_t>& value, int64_t* out) {
  std::string text(value.begin(), value.end());
  if (text.empty() || text.size() > 20) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *out = v;
  return true;
}

}  // namespace

struct TCPStoreServer::State {
  std::string secret;
  store_proto::Limits limits;
  std::unordered_map<std::string, std::vector<uint8_t>> data;
  // Non-empty queues only (a queue popped empty is erased), beside the keys.
  std::unordered_map<std::string, std::deque<std::vector<uint8_t>>> queues;
  size_t reserved_keys = 0;
  std::unordered_map<int, Connection> conns;  // by fd

  void respond(Connection& c, Status status, const std::vector<uint8_t>& body = {}) {
    store_proto::encode_response(status, body.data(), body.size(), &c.out);
  }

  void put(const std::string& key, std::vector<uint8_t> value) {
    auto [it, inserted] = data.insert_or_assign(key, std::move(value));
    if (inserted && is_reserved_key(key)) ++reserved_keys;
  }

  // What check and wait look for: a value or a non-empty queue (c10d's TCPStore). get and
  // multi_get want values.
  bool present(const std::string& key, Op op) const {
    if (data.count(key) > 0) return true;
    return (op == Op::kCheck || op == Op::kWait) && queues.count(key) > 0;
  }

  bool all_present(const Request& request) const {
    for (const auto& k : request.keys) {
      if (!present(k, request.op)) return false;
    }
    return true;
  }

  std::string missing(const Request& request) const {
    std::string out;
    for (const auto& k : request.keys) {
      if (!present(k, request.op)) out += (out.empty() ? "" : ", ") + k;
    }
    return out;
  }

  // Answers a parked request if it can be answered now.
  bool try_finish(Connection& c) {
    const Request& r = c.pending;
    if (r.op == Op::kQueuePop) {
      auto it = queues.find(r.keys.front());
      if (it == queues.end()) return false;
      respond(c, Status::kOk, it->second.front());
      it->second.pop_front();
      if (it->second.empty()) queues.erase(it);
    } else {
      if (!all_present(r)) return false;
      if (r.op == Op::kGet) {
        respond(c, Status::kOk, data.at(r.keys.front()));
      } else if (r.op == Op::kMultiGet) {
        std::vector<const std::vector<uint8_t>*> values;
        for (const auto& k : r.keys) values.push_back(&data.at(k));
        respond(c, Status::kOk, store_proto::encode_values(values));
      } else {
        respond(c, Status::kOk);
      }
    }
    c.parked = false;
    return true;
  }

  void park(Connection& c, Request&& request) {
    c.pending = std::move(request);
    c.pending_deadline = deadline_after(std::chrono::milliseconds(c.pending.number));
    c.parked = true;
  }

  std::vector<uint8_t> expired_body(const Request& request) const {
    return request.op == Op::kQueuePop ? bytes_of(request.keys.front())
                                       : bytes_of(missing(request));
  }

  void wake_parked() {
    for (auto& [fd, c] : conns) {
      if (c.parked) try_finish(c);
    }
  }

  void expire_parked(Deadline now) {
    for (auto& [fd, c] : conns) {
      if (c.parked && c.pending_deadline <= now) {
        respond(c, Status::kTimeout, expired_body(c.pending));
        c.parked = false;
      }
    }
  }

  void handle_auth(Connection& c, const Request& request) {
    if (request.op != Op::kAuth) {
      c.close_now = true;  // nothing is served before authentication
      return;
    }
    const uint8_t* client_nonce = request.value.data();
    const uint8_t* mac = client_nonce + store_proto::kNonceBytes;
    std::vector<uint8_t> nc(client_nonce, client_nonce + store_proto::kNonceBytes);
    auto expected = store_mac(secret, "client", c.server_nonce, nc);
    if (!macs_equal(expected, mac, store_proto::kMacBytes)) {
      c.close_now = true;
      return;
    }
    c.authenticated = true;
    c.handshake_deadline = Deadline::max();
    respond(c, Status::kOk, store_mac(secret, "server", nc, c.server_nonce));
  }

  void handle(Connection& c, Request&& request) {
    if (!c.authenticated) {
      handle_auth(c, request);
      return;
    }
    const std::string empty;
    const std::string& key = request.keys.empty() ? empty : request.keys.front();
    switch (request.op) {
      case Op::kAuth:
        respond(c, Status::kError, bytes_of("already authenticated"));
        return;
      case Op::kSet:
        put(key, std::move(request.value));
        respond(c, Status::kOk);
        wake_parked();
        return;
      case Op::kGet:
      case Op::kWait:
      case Op::kMultiGet:
      case Op::kQueuePop: {
        // A queue pop with a negative timeout does not wait: an empty queue answers at once.
        const bool wait = request.op != Op::kQueuePop || request.number >= 0;
        park(c, std::move(request));
        if (!try_finish(c) && !wait) {
          c.parked = false;
          respond(c, Status::kTimeout, expired_body(c.pending));
        }
        return;
      }
      case Op::kAppend: {
        auto it = data.find(key);
        if (it == data.end()) {
          put(key, std::move(request.value));
        } else {
          it->second.insert(it->second.end(), request.value.begin(), request.value.end());
        }
        respond(c, Status::kOk);
        wake_parked();
        return;
      }
      case Op::kMultiSet:
        for (size_t i = 0; i < request.keys.size(); ++i) {
          put(request.keys[i], std::move(request.values[i]));
        }
        respond(c, Status::kOk);
        wake_parked();
        return;
      case Op::kQueuePush:
        queues[key].push_back(std::move(request.value));
        respond(c, Status::kOk);
        wake_parked();
        return;
      case Op::kQueueLen: {
        auto it = queues.find(key);
        std::vector<uint8_t> body;
        store_proto::put_u64(it == queues.end() ? 0 : it->second.size(), &body);
        respond(c, Status::kOk, body);
        return;
      }
      case Op::kAdd: {
        int64_t current = 0;
        auto it = data.find(key);
        if (it != data.end() && !parse_int(it->second, &current)) {
          respond(c, Status::kError,
                  bytes_of("add: the value of key '" + key + "' is not an integer"));
          return;
        }
        int64_t result = static_cast<int64_t>(static_cast<uint64_t>(current) +
                                              static_cast<uint64_t>(request.number));
        put(key, bytes_of(std::to_string(result)));
        std::vector<uint8_t> body;
        store_proto::put_u64(static_cast<uint64_t>(result), &body);
        respond(c, Status::kOk, body);
        wake_parked();
        return;
      }
      case Op::kCompareSet: {
        auto it = data.find(key);
        if ((it == data.end() && request.expected.empty()) ||
            (it != data.end() && it->second == request.expected)) {
          put(key, request.value);
          respond(c, Status::kOk, request.value);
          wake_parked();
        } else {
          respond(c, Status::kOk, it == data.end() ? request.expected : it->second);
        }
        return;
      }
      case Op::kCheck:
        respond(c, Status::kOk, {static_cast<uint8_t>(all_present(request) ? 1 : 0)});
        return;
      case Op::kDelete: {
        bool existed = data.erase(key) > 0;
        if (existed && is_reserved_key(key)) --reserved_keys;
        respond(c, Status::kOk, {static_cast<uint8_t>(existed ? 1 : 0)});
        return;
      }
      case Op::kNumKeys: {
        std::vector<uint8_t> body;
        store_proto::put_u64(data.size() - reserved_keys, &body);
        respond(c, Status::kOk, body);
        return;
      }
    }
  }

  // Parses and serves every complete request in the connection's input.
  void process_input(Connection& c) {
    size_t pos = 0;
    while (!c.parked && !c.close_now && pos < c.in.size()) {
      Request request;
      auto result =
          store_proto::parse_request(c.in.data() + pos, c.in.size() - pos, limits, &request);
      if (result.status == store_proto::ParseStatus::kNeedMore) break;
      if (result.status == store_proto::ParseStatus::kMalformed) {
        c.close_now = true;
        break;
      }
      pos += result.consumed;
      handle(c, std::move(request));
    }
    if (pos > 0) c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(pos));
  }
};

TCPStoreServer::TCPStoreServer(const std::string& address, int port, std::string secret,
                               store_proto::Limits limits)
    : address_(address), state_(std::make_unique<State>()) {
  state_->secret = std::move(secret);
  state_->limits = limits;
  listener_ = listen_on(address, port, &port_);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    TDIST_THROW(StoreError, std::string("TCPStore server: pipe failed: ") + std::strerror(errno));
  }
  wake_read_ = Socket(fds[0]);
  wake_write_ = Socket(fds[1]);
  thread_ = std::thread([this] { run(); });
}

TCPStoreServer::~TCPStoreServer() {
  stop_ = true;
  char byte = 1;
  (void)!::write(wake_write_.fd(), &byte, 1);
  if (thread_.joinable()) thread_.join();
}

void TCPStoreServer::run() {
  State& s = *state_;
  std::vector<pollfd> fds;
  std::vector<uint8_t> chunk(kReadChunk);
  while (!stop_) {
    // Sleep until I/O or the nearest deadline (parked requests, handshakes).
    Deadline next = Clock::now() + std::chrono::seconds(1);
    fds.clear();
    fds.push_back({listener_.fd(), POLLIN, 0});
    fds.push_back({wake_read_.fd(), POLLIN, 0});
    for (auto& [fd, c] : s.conns) {
      short events = POLLRDHUP;
      if (!c.parked && c.out.size() - c.out_pos < kMaxPendingOutput) events |= POLLIN;
      if (c.out_pos < c.out.size()) events |= POLLOUT;
      fds.push_back({fd, events, 0});
      if (c.parked) next = std::min(next, c.pending_deadline);
      next = std::min(next, c.handshake_deadline);
    }
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now());
    int rc =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, wait.count() + 1)));
    if (rc < 0 && errno != EINTR) {
      std::cerr << "tdist TCPStore server: poll failed: " << std::strerror(errno) << "\n";
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (stop_) break;

    for (size_t i = 2; i < fds.size(); ++i) {
      auto it = s.conns.find(fds[i].fd);
      if (it == s.conns.end()) continue;
      Connection& c = it->second;
      const short got = fds[i].revents;
      if (got & (POLLERR | POLLNVAL)) c.close_now = true;
      if ((got & (POLLIN | POLLHUP | POLLRDHUP)) && !c.close_now) {
        if (got & POLLIN) {
          ssize_t n = ::recv(c.sock.fd(), chunk.data(), chunk.size(), MSG_DONTWAIT);
          if (n > 0) {
            c.in.insert(c.in.end(), chunk.data(), chunk.data() + n);
            s.process_input(c);
          } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            c.close_now = true;
          }
        } else {
          c.close_now = true;  // peer hung up while parked
        }
      }
    }

    // Serve what the new input and the clock allow, then flush output.
    const Deadline now = Clock::now();
    s.expire_parked(now);
    for (auto& [fd, c] : s.conns) {
      if (c.handshake_deadline <= now) c.close_now = true;
      if (!c.parked && !c.close_now && !c.in.empty()) s.process_input(c);
      while (!c.close_now && c.out_pos < c.out.size()) {
        ssize_t n = ::send(fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          c.out_pos += static_cast<size_t>(n);
        } else {
          if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            c.close_now = true;
          }
          break;
        }
      }
      if (c.out_pos == c.out.size()) {
        c.out.clear();
        c.out_pos = 0;
      }
    }
    for (auto it = s.conns.begin(); it != s.conns.end();) {
      it = it->second.close_now ? s.conns.erase(it) : std::next(it);
    }

    try {
      accept_all();
    } catch (const std::exception& e) {
      std::cerr << "tdist TCPStore server: accepting a connection failed: " << e.what() << "\n";
    }
  }
  s.conns.clear();
}

// New connections: each gets a hello (and a nonce to answer when auth is on).
void TCPStoreServer::accept_all() {
  State& s = *state_;
  while (true) {
    int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    Socket sock(fd);
    if (s.conns.size() >= kMaxConnections) continue;  // closed by Socket
    Connection c;
    c.sock = std::move(sock);
    const bool auth = !s.secret.empty();
    c.authenticated = !auth;
    std::vector<uint8_t> nonce(store_proto::kNonceBytes, 0);
    if (auth) {
      nonce = random_bytes(store_proto::kNonceBytes);
      c.handshake_deadline = Clock::now() + kHandshakeTimeout;
    }
    c.server_nonce = nonce;
    c.out = store_proto::encode_hello(auth, nonce.data());
    s.conns.emplace(fd, std::move(c));
  }
}

}  // namespace tdist::detail

#include "tdist/store/tcp_store.h"

#include <iostream>

#include "store/reserved_keys.h"
#include "store/store_auth.h"
#include "store/tcp_store_client.h"
#include "store/tcp_store_server.h"
#include "tdist/error.h"

namespace tdist {

using detail::store_proto::Op;
using detail::store_proto::Request;
using detail::store_proto::Status;

class TCPStore::Server : public detail::TCPStoreServer {
 public:
  using TCPStoreServer::TCPStoreServer;
};

class TCPStore::Client : public detail::TCPStoreClient {
 public:
  using TCPStoreClient::TCPStoreClient;
};

namespace {

// Extra time a client allows beyond a server-side timeout before it gives up on the reply.
constexpr std::chrono::milliseconds kReplyGrace{5000};

bool is_wildcard(const std::string& address) {
  return address.empty() || address == "0.0.0.0" || address == "::" || address == "*";
}

std::string text_of(const std::vector<uint8_t>& body) {
  return {body.begin(), body.end()};
}

int64_t int_of(const std::vector<uint8_t>& body, const char* op) {
  if (body.size() != 8) TDIST_THROW(StoreError, std::string("TCPStore::") + op + ": bad reply");
  return static_cast<int64_t>(detail::store_proto::get_u64(body.data()));
}

/// What a client prints once while its server has not appeared yet.
detail::SlowConnectNotice waiting_for_server_notice(const TCPStoreOptions& options,
                                                    const std::string& where) {
  std::string text = (options.client_name().empty() ? "tdist" : options.client_name()) +
                     ": waiting for the store at " + where;
  if (!options.server_name().empty()) text += " (" + options.server_name() + " hosts it)";
  const std::string timeout = detail::duration_text(options.timeout());
  return {options.notice_after(), [text, timeout](std::chrono::milliseconds waited) {
            std::cerr << text + "; " + std::to_string(waited.count() / 1000) +
                             " s so far, timeout " + timeout + "\n"
                      << std::flush;
          }};
}

}  // namespace

TCPStore::TCPStore(const std::string& host, const TCPStoreOptions& options)
    : Store(options.timeout()), host_(host), port_(options.port()) {
  TDIST_CHECK_ARG(options.port() >= 0 && options.port() <= 65535,
                  "TCPStore: port " + std::to_string(options.port()) +
                      " is out of range [0, 65535]; set MASTER_PORT to a valid port");
  TDIST_CHECK_ARG(options.is_server() || options.port() != 0,
                  "TCPStore: a client needs the server's port (got 0); set MASTER_PORT");
  detail::store_proto::Limits limits;
  limits.max_key_bytes = options.max_key_bytes();
  limits.max_value_bytes = options.max_value_bytes();
  const std::string secret = detail::resolve_store_secret(options.secret());
  std::string connect_host = host;
  if (options.is_server()) {
    const std::string bind = options.bind_address().empty() ? host : options.bind_address();
    server_ = std::make_unique<Server>(bind, options.port(), secret, limits);
    port_ = server_->port();
    // The hosting process reaches its own server through the address it bound.
    if (!is_wildcard(bind))
      connect_host = bind;
    else
      connect_host = bind == "::" ? "::1" : "127.0.0.1";
  }
  client_ = std::make_unique<Client>(connect_host, port_, options.timeout(), secret, limits);
  client_->connect_now(options.is_server() ? detail::SlowConnectNotice{}
                                           : waiting_for_server_notice(options, client_->where()));

  // Every process counts itself in; the server waits until num_workers have (like c10d).
  const std::string joined = detail::kReservedKeyPrefix + "joined";
  const int64_t me = add(joined, 1);
  set(joined + "/" + std::to_string(me), std::string());
  if (options.is_server() && options.wait_for_workers() && options.num_workers() > 0) {
    try {
      wait({joined + "/" + std::to_string(options.num_workers())}, options.timeout());
    } catch (const TimeoutError&) {
      TDIST_THROW(TimeoutError, "TCPStore at " + host + ":" + std::to_string(port_) + ": only " +
                                    std::to_string(add(joined, 0)) + " of " +
                                    std::to_string(options.num_workers()) +
                                    " workers joined within " +
                                    std::to_string(options.timeout().count()) +
                                    " ms; start the missing ranks or lower WORLD_SIZE");
    }
  }
}

TCPStore::~TCPStore() = default;

bool TCPStore::is_server() const {
  return server_ != nullptr;
}

namespace {

void check_reply(const detail::TCPStoreClient::Reply& reply, const std::string& op) {
  if (reply.status == Status::kError) {
    TDIST_THROW(StoreError, "TCPStore::" + op + ": " + text_of(reply.body));
  }
}

}  // namespace

void TCPStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  Request r;
  r.op = Op::kSet;
  r.keys = {key};
  r.value = value;
  check_reply(client_->call(r, timeout_), "set");
}

std::vector<uint8_t> TCPStore::get(const std::string& key) {
  Request r;
  r.op = Op::kGet;
  r.keys = {key};
  r.number = timeout_.count();
  auto reply = client_->call(r, timeout_.count() > 0 ? timeout_ + kReplyGrace : timeout_);
  if (reply.status == Status::kTimeout) {
    TDIST_THROW(TimeoutError, "TCPStore::get: key '" + key + "' was not set within " +
                                  std::to_string(timeout_.count()) + " ms (store at " +
                                  client_->where() +
                                  "); a rank that should set it may be "
                                  "missing or slow");
  }
  check_reply(reply, "get");
  return std::move(reply.body);
}

int64_t TCPStore::add(const std::string& key, int64_t value) {
  Request r;
  r.op = Op::kAdd;
  r.keys = {key};
  r.number = value;
  auto reply = client_->call(r, timeout_);
  check_reply(reply, "add");
  return int_of(reply.body, "add");
}

std::vector<uint8_t> TCPStore::compare_set(const std::string& key,
                                           const std::vector<uint8_t>& expected,
                                           const std::vector<uint8_t>& desired) {
  Request r;
  r.op = Op::kCompareSet;
  r.keys = {key};
  r.expected = expected;
  r.value = desired;
  auto reply = client_->call(r, timeout_);
  check_reply(reply, "compare_set");
  return std::move(reply.body);
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  Request r;
  r.op = Op::kCheck;
  r.keys = keys;
  auto reply = client_->call(r, timeout_);
  check_reply(reply, "check");
  return reply.body.size() == 1 && reply.body[0] == 1;
}

bool TCPStore::delete_key(const std::string& key) {
  Request r;
  r.op = Op::kDelete;
  r.keys = {key};
  auto reply = client_->call(r, timeout_);
  check_reply(reply, "delete_key");
  return reply.body.size() == 1 && reply.body[0] == 1;
}

int64_t TCPStore::num_keys() {
  Request r;
  r.op = Op::kNumKeys;
  auto reply = client_->call(r, timeout_);
  check_reply(reply, "num_keys");
  return int_of(reply.body, "num_keys");
}

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  Request r;
  r.op = Op::kWait;
  r.keys = keys;
  r.number = timeout.count();
  auto reply = client_->call(r, timeout.count() > 0 ? timeout + kReplyGrace : timeout);
  if (reply.status == Status::kTimeout) {
    TDIST_THROW(TimeoutError, "TCPStore::wait: keys [" + text_of(reply.body) + "] not set within " +
                                  std::to_string(timeout.count()) + " ms (store at " +
                                  client_->where() +
                                  "); a rank that should set them may be missing or slow");
  }
  check_reply(reply, "wait");
}

}  // namespace tdist

namespace tdist {

void TCPStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  Request r;
  r.op = Op::kAppend;
  r.keys = {key};
  r.value = value;
  check_reply(client_->call(r, timeout_), "append");
}

std::vector<std::vector<uint8_t>> TCPStore::multi_get(const std::vector<std::string>& keys) {
  Request r;
  r.op = Op::kMultiGet;
  r.keys = keys;
  r.number = timeout_.count();
  auto reply = client_->call(r, timeout_.count() > 0 ? timeout_ + kReplyGrace : timeout_);
  if (reply.status == Status::kTimeout) {
    TDIST_THROW(TimeoutError, "TCPStore::multi_get: keys [" + text_of(reply.body) +
                                  "] not set within " + std::to_string(timeout_.count()) +
                                  " ms (store at " + client_->where() +
                                  "); a rank that should set them may be missing or slow");
  }
  check_reply(reply, "multi_get");
  std::vector<std::vector<uint8_t>> values;
  if (!detail::store_proto::parse_values(reply.body, keys.size(), &values)) {
    TDIST_THROW(StoreError, "TCPStore::multi_get: bad reply from the store at " + client_->where());
  }
  return values;
}

void TCPStore::multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::vector<uint8_t>>& values) {
  check_multi_set_args("TCPStore::multi_set", keys, values);
  Request r;
  r.op = Op::kMultiSet;
  r.keys = keys;
  r.values = values;
  check_reply(client_->call(r, timeout_), "multi_set");
}

void TCPStore::queue_push(const std::string& key, const std::vector<uint8_t>& value) {
  Request r;
  r.op = Op::kQueuePush;
  r.keys = {key};
  r.value = value;
  check_reply(client_->call(r, timeout_), "queue_push");
}

std::vector<uint8_t> TCPStore::queue_pop(const std::string& key, bool block,
                                         std::chrono::milliseconds timeout) {
  Request r;
  r.op = Op::kQueuePop;
  r.keys = {key};
  // On the wire: 0 waits without limit, a negative timeout does not wait.
  r.number = !block ? -1 : std::max<int64_t>(timeout.count(), 0);
  const auto io_timeout = !block ? timeout_ : timeout.count() > 0 ? timeout + kReplyGrace : timeout;
  auto reply = client_->call(r, io_timeout);
  if (reply.status == Status::kTimeout) {
    if (!block) {
      TDIST_THROW(QueueEmptyError, "TCPStore::queue_pop: queue '" + key + "' is empty (store at " +
                                       client_->where() + ")");
    }
    TDIST_THROW(TimeoutError, "TCPStore::queue_pop: queue '" + key + "' stayed empty for " +
                                  std::to_string(timeout.count()) + " ms (store at " +
                                  client_->where() +
                                  "); nothing was pushed to it in time (a rank that should push "
                                  "may be missing or slow, or every item was popped)");
  }
  check_reply(reply, "queue_pop");
  return std::move(reply.body);
}

int64_t TCPStore::queue_len(const std::string& key) {
  Request r;
  r.op = Op::kQueueLen;
  r.keys = {key};
  auto reply = client_->call(r, timeout_);
  check_reply(reply, "queue_len");
  return int_of(reply.body, "queue_len");
}

}  // namespace tdist

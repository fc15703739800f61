#include "store/tcp_store_client.h"

#include <algorithm>

#include "store/store_auth.h"
#include "tdist/error.h"

namespace tdist::detail {

using store_proto::Op;
using store_proto::Request;
using store_proto::Status;

TCPStoreClient::TCPStoreClient(std::string host, int port,
                               std::chrono::milliseconds connect_timeout, std::string secret,
                               store_proto::Limits limits)
    : host_(std::move(host)),
      port_(port),
      connect_timeout_(connect_timeout),
      secret_(std::move(secret)),
      limits_(limits) {}

Socket TCPStoreClient::open(const SlowConnectNotice& notice) {
  Socket sock = connect_with_retry(host_, port_, connect_timeout_, notice);
  const Deadline deadline = deadline_after(connect_timeout_);
  const std::string what = "TCPStore handshake with " + where();
  uint8_t hello[store_proto::kHelloBytes];
  try {
    recv_all(sock.fd(), hello, sizeof(hello), deadline, what);
  } catch (const StoreError& e) {
    // A server that drops us before saying hello is usually one over its connection limit.
    TDIST_THROW(StoreError, std::string(e.what()) + " before its greeting");
  }
  bool auth_required = false;
  std::vector<uint8_t> server_nonce;
  if (!store_proto::parse_hello(hello, &auth_required, &server_nonce)) {
    TDIST_THROW(StoreError, what +
                                ": the service there is not a tdist store (or another "
                                "version); check MASTER_ADDR/MASTER_PORT");
  }
  if (auth_required && secret_.empty()) {
    TDIST_THROW(StoreError, "TCPStore: authentication failed: the store at " + where() +
                                " requires a shared secret and this process has none; set "
                                "TDIST_STORE_SECRET or TDIST_STORE_SECRET_FILE as the job's "
                                "launcher did");
  }
  if (!auth_required && !secret_.empty()) {
    TDIST_THROW(StoreError, "TCPStore: authentication failed: the store at " + where() +
                                " does not ask for the shared secret this process has; "
                                "refusing to trust it (is it the job's store?)");
  }
  if (auth_required) {
    Request auth;
    auth.op = Op::kAuth;
    auto client_nonce = random_bytes(store_proto::kNonceBytes);
    auth.value = client_nonce;
    auto mac = store_mac(secret_, "client", server_nonce, client_nonce);
    auth.value.insert(auth.value.end(), mac.begin(), mac.end());
    std::vector<uint8_t> frame;
    store_proto::encode_request(auth, &frame);
    uint8_t header[store_proto::kFrameHeaderBytes];
    uint8_t proof[store_proto::kMacBytes];
    try {
      send_all(sock.fd(), frame.data(), frame.size(), deadline, what);
      recv_all(sock.fd(), header, sizeof(header), deadline, what);
      if (header[0] != static_cast<uint8_t>(Status::kOk) ||
          store_proto::get_u64(header + 1) != store_proto::kMacBytes) {
        TDIST_THROW(StoreError, "unexpected reply");
      }
      recv_all(sock.fd(), proof, sizeof(proof), deadline, what);
    } catch (const StoreError& e) {
      TDIST_THROW(StoreError, "TCPStore: authentication failed: the store at " + where() +
                                  " refused this process's secret (" + e.what() +
                                  "); every rank needs the same TDIST_STORE_SECRET");
    }
    if (!macs_equal(store_mac(secret_, "server", client_nonce, server_nonce), proof,
                    sizeof(proof))) {
      TDIST_THROW(StoreError, "TCPStore: authentication failed: the store at " + where() +
                                  " could not prove it knows the shared secret");
    }
  }
  return sock;
}

void TCPStoreClient::connect_now(const SlowConnectNotice& notice) {
  Socket sock = open(notice);
  std::lock_guard<std::mutex> lock(mutex_);
  idle_.push_back(std::move(sock));
}

void TCPStoreClient::check_limits(const Request& request) const {
  for (const auto& key : request.keys) {
    if (key.size() > limits_.max_key_bytes) {
      TDIST_THROW(InvalidArgument, "TCPStore: a key of " + std::to_string(key.size()) +
                                       " bytes is over the limit of " +
                                       std::to_string(limits_.max_key_bytes) +
                                       " (TCPStoreOptions::max_key_bytes)");
    }
  }
  if (request.keys.size() > limits_.max_keys) {
    TDIST_THROW(InvalidArgument, "TCPStore: " + std::to_string(request.keys.size()) +
                                     " keys in one request, over the limit of " +
                                     std::to_string(limits_.max_keys) + "; split the call");
  }
  for (const auto* value : {&request.value, &request.expected}) {
    if (request.op != Op::kAuth && value->size() > limits_.max_value_bytes) {
      TDIST_THROW(InvalidArgument, "TCPStore: a value of " + std::to_string(value->size()) +
                                       " bytes is over the limit of " +
                                       std::to_string(limits_.max_value_bytes) +
                                       " (TCPStoreOptions::max_value_bytes)");
    }
  }
  uint64_t total = 0;
  for (const auto& value : request.values) total += value.size();
  if (total > limits_.max_value_bytes) {
    TDIST_THROW(InvalidArgument, "TCPStore::multi_set: the values come to " +
                                     std::to_string(total) + " bytes, over the limit of " +
                                     std::to_string(limits_.max_value_bytes) +
                                     " for one request (TCPStoreOptions::max_value_bytes); "
                                     "split the call or raise the limit");
  }
}

TCPStoreClient::Reply TCPStoreClient::call(const Request& request,
                                           std::chrono::milliseconds io_timeout) {
  check_limits(request);
  Socket sock;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_.empty()) {
      sock = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (!sock.valid()) sock = open();
  // On any error the socket is dropped (closed), never reused mid-message.
  std::vector<uint8_t> frame;
  store_proto::encode_request(request, &frame);
  const Deadline deadline = deadline_after(io_timeout);
  const std::string what = "TCPStore request to " + where();
  send_all(sock.fd(), frame.data(), frame.size(), deadline, what);
  uint8_t header[store_proto::kFrameHeaderBytes];
  recv_all(sock.fd(), header, sizeof(header), deadline, what);
  Reply reply;
  reply.status = static_cast<Status>(header[0]);
  const uint64_t length = store_proto::get_u64(header + 1);
  if (header[0] > static_cast<uint8_t>(Status::kError) ||
      length > store_proto::max_reply_bytes(request, limits_)) {
    TDIST_THROW(StoreError, what + ": malformed reply from the store");
  }
  reply.body.resize(length);
  recv_all(sock.fd(), reply.body.data(), length, deadline, what);
  std::lock_guard<std::mutex> lock(mutex_);
  idle_.push_back(std::move(sock));
  return reply;
}

}  // namespace tdist::detail

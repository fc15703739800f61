#pragma once

// The TCP store's client side: a small pool of authenticated connections, so threads of one
// process sharing a TCPStore never wait behind each other's blocking get/wait.

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "store/socket.h"
#include "store/tcp_store_protocol.h"

namespace tdist::detail {

class TCPStoreClient {
 public:
  TCPStoreClient(std::string host, int port, std::chrono::milliseconds connect_timeout,
                 std::string secret, store_proto::Limits limits);

  struct Reply {
    store_proto::Status status = store_proto::Status::kOk;
    std::vector<uint8_t> body;
  };

  /// Sends one request and reads its reply before `io_timeout` (<= 0: no limit).
  Reply call(const store_proto::Request& request, std::chrono::milliseconds io_timeout);

  /// Opens (and authenticates) one connection now, so errors surface at construction;
  /// `notice` speaks up if the server is slow to appear.
  void connect_now(const SlowConnectNotice& notice = {});

  std::string where() const { return host_ + ":" + std::to_string(port_); }

 private:
  Socket open(const SlowConnectNotice& notice = {});
  void check_limits(const store_proto::Request& request) const;
  std::string host_;
  int port_;
  std::chrono::milliseconds connect_timeout_;
  std::string secret_;
  store_proto::Limits limits_;
  std::mutex mutex_;
  std::vector<Socket> idle_;
};

}  // namespace tdist::detail

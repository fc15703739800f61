#pragma once

// The TCP store's server: one thread multiplexing every connection with poll() over
// non-blocking sockets, so a slow, silent or malicious client never blocks the others.
// Blocking get/wait requests are parked until their keys appear or their deadline passes:
// no polling by the client, no thread per waiter.

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "store/socket.h"
#include "store/tcp_store_protocol.h"

namespace tdist::detail {

class TCPStoreServer {
 public:
  /// Binds address:port (port 0: ephemeral) and starts serving. secret empty: no auth.
  TCPStoreServer(const std::string& address, int port, std::string secret,
                 store_proto::Limits limits);
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  int port() const { return port_; }
  const std::string& address() const { return address_; }
  /// "ip:port" the listening socket is bound to (getsockname).
  std::string bound_address() const { return local_address(listener_.fd()); }

 private:
  struct State;
  void run();
  void accept_all();

  std::string address_;
  int port_ = 0;
  Socket listener_;
  Socket wake_read_, wake_write_;
  std::unique_ptr<State> state_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tdist::detail

#pragma once

// The TCP store: one process (usually rank 0) hosts the server, every process is a client.
// Security (see docs/security.md): the server binds only the address it is given, and with
// a shared secret every client must pass an HMAC-SHA256 challenge-response before any
// request is served. Keys and values have size limits; malformed input closes the
// connection, never the server.

#include <memory>
#include <string>

#include "tdist/arg.h"
#include "tdist/store/store.h"

namespace tdist {

struct TCPStoreOptions {
  /// Port to listen on / connect to; 0 with is_server: pick a free port (see port()).
  TDIST_ARG(int, port) = 29500;
  TDIST_ARG(bool, is_server) = false;
  /// Number of workers expected (server waits for them in wait_for_workers); -1: unknown.
  TDIST_ARG(int, num_workers) = -1;
  TDIST_ARG(bool, wait_for_workers) = true;
  /// Timeout for connecting and for every blocking request.
  TDIST_ARG(std::chrono::milliseconds, timeout) = Store::kDefaultTimeout;
  /// Address the server binds. Empty: the `host` given to the constructor.
  TDIST_ARG(std::string, bind_address) = "";
  /// Shared secret for challenge-response authentication; empty: read TDIST_STORE_SECRET
  /// or the file named by TDIST_STORE_SECRET_FILE; still empty: no authentication.
  TDIST_ARG(std::string, secret) = "";
  /// A client still waiting for its server after `notice_after` says so once on stderr
  /// (what it waits for, how long so far, the timeout) and keeps waiting, so a process
  /// started before its server is not silent. 0: never. `client_name` / `server_name`
  /// name the two ends in that notice (for example "rank 1" and "rank 0").
  TDIST_ARG(std::chrono::milliseconds, notice_after) = std::chrono::seconds(5);
  TDIST_ARG(std::string, client_name) = "";
  TDIST_ARG(std::string, server_name) = "";
  /// Largest key and value accepted, in bytes.
  TDIST_ARG(size_t, max_key_bytes) = 4096;
  TDIST_ARG(size_t, max_value_bytes) = 256 * 1024 * 1024;
};

class TCPStore : public Store {
 public:
  /// Server: binds host:port and also connects as a client. Client: connects to host:port,
  /// retrying until the timeout, then throws naming host:port.
  TCPStore(const std::string& host, const TCPStoreOptions& options = {});
  ~TCPStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  std::vector<uint8_t> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                   const std::vector<uint8_t>& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  void append(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<std::vector<uint8_t>> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::vector<uint8_t>>& values) override;
  void queue_push(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> queue_pop(const std::string& key, bool block,
                                 std::chrono::milliseconds timeout) override;
  int64_t queue_len(const std::string& key) override;
  using Store::append;
  using Store::multi_set;
  using Store::queue_pop;
  using Store::queue_push;
  using Store::set;
  using Store::wait;

  const std::string& host() const { return host_; }
  /// The port actually bound (useful with port 0).
  int port() const { return port_; }
  bool is_server() const;

 private:
  class Server;
  class Client;
  std::string host_;
  int port_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

}  // namespace tdist

// Store security (docs/security.md): authentication, and hostile or broken clients that must
// neither crash the server nor block legitimate clients.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "store/tcp_store_protocol.h"
#include "store_contract.h"
#include "support/ranks.h"
#include "tdist/error.h"
#include "tdist/store/tcp_store.h"

namespace {

using tdist::TCPStore;
using tdist::TCPStoreOptions;
using tdist::testing::server_options;
using namespace std::chrono_literals;
namespace proto = tdist::detail::store_proto;

// A raw TCP connection for speaking (or not speaking) the protocol by hand.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  ~RawClient() { ::close(fd_); }
  void send(const std::vector<uint8_t>& bytes) {
    ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  void send(const std::string& text) { send(std::vector<uint8_t>(text.begin(), text.end())); }
  /// Reads whatever arrives until the peer closes or `timeout` passes.
  std::vector<uint8_t> read_until_closed(std::chrono::milliseconds timeout, bool* closed) {
    std::vector<uint8_t> got;
    *closed = false;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, 20) <= 0) continue;
      uint8_t buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        *closed = true;
        break;
      }
      got.insert(got.end(), buf, buf + n);
    }
    return got;
  }

 private:
  int fd_ = -1;
};

std::vector<uint8_t> set_frame(const std::string& key, const std::string& value) {
  proto::Request r;
  r.op = proto::Op::kSet;
  r.keys = {key};
  r.value.assign(value.begin(), value.end());
  std::vector<uint8_t> out;
  proto::encode_request(r, &out);
  return out;
}

std::vector<uint8_t> get_frame(const std::string& key) {
  proto::Request r;
  r.op = proto::Op::kGet;
  r.keys = {key};
  r.number = 1000;
  std::vector<uint8_t> out;
  proto::encode_request(r, &out);
  return out;
}

TEST(TCPStoreAuth, SameSecretWorks) {
  TCPStore server("127.0.0.1", server_options().secret("correct horse"));
  TCPStore client("127.0.0.1",
                  TCPStoreOptions().port(server.port()).timeout(5s).secret("correct horse"));
  client.set("k", std::string("v"));
  EXPECT_EQ(server.get_string("k"), "v");
}

void expect_auth_failure(const std::function<void()>& fn) {
  try {
    fn();
    ADD_FAILURE() << "connected without the right secret";
  } catch (const tdist::StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("authentication failed"), std::string::npos) << e.what();
  }
}

TEST(TCPStoreAuth, WrongSecretIsRefusedAndTouchesNothing) {
  TCPStore server("127.0.0.1", server_options().secret("right"));
  server.set("secret_key", std::string("secret_value"));
  const int64_t keys = server.num_keys();
  expect_auth_failure([&] {
    TCPStore("127.0.0.1", TCPStoreOptions().port(server.port()).timeout(2s).secret("wrong"));
  });
  EXPECT_EQ(server.num_keys(), keys);
}

TEST(TCPStoreAuth, NoSecretIsRefused) {
  TCPStore server("127.0.0.1", server_options().secret("right"));
  expect_auth_failure(
      [&] { TCPStore("127.0.0.1", TCPStoreOptions().port(server.port()).timeout(2s)); });
}

TEST(TCPStoreAuth, ClientWithSecretRefusesAServerWithout) {
  TCPStore server("127.0.0.1", server_options());
  expect_auth_failure([&] {
    TCPStore("127.0.0.1", TCPStoreOptions().port(server.port()).timeout(2s).secret("s"));
  });
}

TEST(TCPStoreAuth, UnauthenticatedRequestsAreNeitherServedNorApplied) {
  TCPStore server("127.0.0.1", server_options().secret("right"));
  server.set("secret_key", std::string("secret_value"));
  const int64_t keys = server.num_keys();
  for (int attempt = 0; attempt < 3; ++attempt) {
    RawClient raw(server.port());
    if (attempt == 1) {
      // A well-formed auth message with a wrong MAC, then requests.
      proto::Request auth;
      auth.op = proto::Op::kAuth;
      auth.value.assign(proto::kNonceBytes + proto::kMacBytes, 0x5a);
      std::vector<uint8_t> frame;
      proto::encode_request(auth, &frame);
      raw.send(frame);
    }
    if (attempt == 2) {
      raw.send(get_frame("secret_key"));
    } else {
      raw.send(set_frame("intruder", "x"));
      raw.send(get_frame("secret_key"));
    }
    bool closed = false;
    auto got = raw.read_until_closed(5s, &closed);
    EXPECT_TRUE(closed) << "attempt " << attempt;
    // At most the hello came back (the close may reset it away): no value, no reply.
    EXPECT_LE(got.size(), proto::kHelloBytes) << "attempt " << attempt;
    const std::string text(got.begin(), got.end());
    EXPECT_EQ(text.find("secret_value"), std::string::npos);
  }
  EXPECT_FALSE(server.check({"intruder"}));
  EXPECT_EQ(server.num_keys(), keys);
}

TDIST_SCENARIO(tcp_store_secret_from_env) {
  const int rank = tdist::testing::env_int("RANK", -1);
  const int world = tdist::testing::env_int("WORLD_SIZE", -1);
  TCPStore store("127.0.0.1", TCPStoreOptions()
                                  .port(tdist::testing::env_int("MASTER_PORT", -1))
                                  .is_server(rank == 0)
                                  .num_workers(world)
                                  .timeout(std::chrono::milliseconds(
                                      tdist::testing::env_int("TDIST_TEST_TIMEOUT_MS", 30000))));
  store.set("r" + std::to_string(rank), std::string("1"));
  store.wait({"r0", "r1"});
  store.add("left", 1);
  if (rank == 0) {
    while (store.add("left", 0) < world) std::this_thread::sleep_for(5ms);
  }
}

TEST(TCPStoreAuth, SecretFromEnvironmentAndFile) {
  tdist::testing::ProcessOptions options;
  options.timeout = 60s;
  options.env["TDIST_STORE_SECRET"] = "from-env";
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("tcp_store_secret_from_env", 2, options));

  const std::string file = tdist::testing::make_temp_dir("tdist-secret") + "/secret";
  std::ofstream(file) << "from-file\n";
  ::chmod(file.c_str(), 0600);
  options.env.erase("TDIST_STORE_SECRET");
  options.env["TDIST_STORE_SECRET_FILE"] = file;
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("tcp_store_secret_from_env", 2, options));

  // Rank 1 with a different secret is refused (and rank 0 times out waiting for it).
  options.timeout = 30s;
  options.env["TDIST_TEST_TIMEOUT_MS"] = "2000";
  options.rank_env[1]["TDIST_STORE_SECRET_FILE"] = "";
  options.rank_env[1]["TDIST_STORE_SECRET"] = "other";
  auto results = tdist::testing::run_ranks_as_processes("tcp_store_secret_from_env", 2, options);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_FALSE(results[1].ok());
  EXPECT_NE(results[1].output.find("authentication failed"), std::string::npos)
      << results[1].output;
}

// Hostile clients, all at once; the legitimate client must be served meanwhile.
TEST(TCPStoreRobustness, HostileClientsNeitherCrashNorBlockTheServer) {
  TCPStore server("127.0.0.1", server_options().max_value_bytes(1 << 20));
  // The legitimate client gets a short timeout: a blocked server fails the test.
  TCPStore client("127.0.0.1", TCPStoreOptions().port(server.port()).timeout(3s));

  std::vector<std::unique_ptr<RawClient>> hostile;
  auto open = [&] {
    hostile.push_back(std::make_unique<RawClient>(server.port()));
    return hostile.back().get();
  };
  std::mt19937 rng(7);
  std::vector<uint8_t> random(4096);
  for (auto& b : random) b = static_cast<uint8_t>(rng());
  RawClient* garbage = open();
  garbage->send(random);
  RawClient* http = open();
  http->send("GET / HTTP/1.1\r\nHost: store\r\nUser-Agent: nmap\r\n\r\n");
  RawClient* huge = open();
  std::vector<uint8_t> huge_frame{static_cast<uint8_t>(proto::Op::kSet)};
  proto::put_u64(uint64_t{1} << 63, &huge_frame);
  huge->send(huge_frame);
  RawClient* over_limit = open();
  over_limit->send(set_frame("k", std::string((1 << 20) + 1, 'x')));
  // Slow: half a frame, then silence. Silent: connects and says nothing.
  RawClient* slow = open();
  auto partial = set_frame("slow", "value");
  partial.resize(partial.size() / 2);
  slow->send(partial);
  open();

  for (int i = 0; i < 20; ++i) {
    client.set("legit" + std::to_string(i), std::to_string(i));
    EXPECT_EQ(client.get_string("legit" + std::to_string(i)), std::to_string(i));
  }
  // Malformed connections were closed; the slow one is still open but harmless.
  for (RawClient* bad : {garbage, http, huge, over_limit}) {
    bool closed = false;
    bad->read_until_closed(5s, &closed);
    EXPECT_TRUE(closed);
  }
  EXPECT_FALSE(client.check({"slow"}));
  // A client that finishes its frame late is still served correctly.
  auto rest = set_frame("slow", "value");
  slow->send(
      std::vector<uint8_t>(rest.begin() + static_cast<std::ptrdiff_t>(partial.size()), rest.end()));
  client.wait({"slow"}, 3s);
  EXPECT_EQ(client.get_string("slow"), "value");
}

TEST(TCPStoreRobustness, ManyGarbageConnectionsInARow) {
  TCPStore server("127.0.0.1", server_options());
  TCPStore client("127.0.0.1", TCPStoreOptions().port(server.port()).timeout(3s));
  std::mt19937 rng(11);
  for (int i = 0; i < 50; ++i) {
    RawClient raw(server.port());
    std::vector<uint8_t> bytes(1 + rng() % 256);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    raw.send(bytes);
  }
  client.set("after", std::string("garbage"));
  EXPECT_EQ(client.get_string("after"), "garbage");
}

TEST(TCPStoreRobustness, ExtremeWaitTimeoutsAreSafe) {
  TCPStore server("127.0.0.1", server_options());
  RawClient forever(server.port()), past(server.port());
  for (auto [raw, ms] : {std::pair<RawClient*, int64_t>{&forever, INT64_MAX},
                         std::pair<RawClient*, int64_t>{&past, INT64_MIN}}) {
    proto::Request r;
    r.op = proto::Op::kWait;
    r.keys = {"x"};
    r.number = ms;
    std::vector<uint8_t> frame;
    proto::encode_request(r, &frame);
    raw->send(frame);
  }
  std::this_thread::sleep_for(50ms);
  server.set("x", std::string("1"));
  // Both waits are answered "ok" (header: status 0, length 0) after the hello.
  for (RawClient* raw : {&forever, &past}) {
    bool closed = false;
    auto got = raw->read_until_closed(300ms, &closed);
    ASSERT_EQ(got.size(), proto::kHelloBytes + proto::kFrameHeaderBytes);
    EXPECT_EQ(got[proto::kHelloBytes], static_cast<uint8_t>(proto::Status::kOk));
  }
}

TEST(TCPStoreRobustness, NonStoreServerIsReported) {
  // Something else listens on the port (here: a socket that answers HTTP).
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread web([&] {
    int c = ::accept(fd, nullptr, nullptr);
    const std::string reply =
        "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    ::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
    std::this_thread::sleep_for(100ms);
    ::close(c);
  });
  try {
    TCPStore("127.0.0.1", TCPStoreOptions().port(ntohs(addr.sin_port)).timeout(2s));
    ADD_FAILURE() << "talked to a web server as if it were a store";
  } catch (const tdist::StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("not a tdist store"), std::string::npos) << e.what();
  }
  web.join();
  ::close(fd);
}

}  // namespace

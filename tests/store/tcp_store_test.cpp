#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "store/tcp_store_server.h"
#include "store_contract.h"
#include "support/ranks.h"
#include "tdist/store/prefix_store.h"
#include "tdist/store/tcp_store.h"

namespace {

using tdist::TCPStore;
using tdist::TCPStoreOptions;
using tdist::testing::server_options;
using namespace std::chrono_literals;

TEST(StoreContract, TCPStore) {
  TCPStore store("127.0.0.1", server_options());
  EXPECT_TRUE(store.is_server());
  EXPECT_GT(store.port(), 0);
  tdist::testing::check_store_contract(store, "");
}

TEST(StoreContract, PrefixStoreOverTCPStore) {
  auto base = std::make_shared<TCPStore>("127.0.0.1", server_options());
  tdist::PrefixStore store("g", base);
  tdist::testing::check_store_contract(store, "");
}

TEST(TCPStore, ClientSeesServerKeysAndBlockingGetIsServedByTheServer) {
  TCPStore server("127.0.0.1", server_options());
  TCPStore client("127.0.0.1", TCPStoreOptions().port(server.port()).timeout(10s));
  EXPECT_FALSE(client.is_server());
  server.set("from_server", std::string("s"));
  EXPECT_EQ(client.get_string("from_server"), "s");
  // Several threads of one client block in get at once; one set releases all of them.
  std::vector<std::thread> waiters;
  std::atomic<int> served{0};
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      if (client.get_string("later") == "v") ++served;
    });
  }
  std::this_thread::sleep_for(50ms);
  server.set("later", std::string("v"));
  for (auto& t : waiters) t.join();
  EXPECT_EQ(served.load(), 4);
}

TEST(TCPStore, RanksAsThreads) {
  for (int world : {1, 2, 3, 4}) {
    TCPStore host("127.0.0.1", server_options().num_workers(world + 1).wait_for_workers(false));
    const int port = host.port();
    tdist::testing::run_ranks_as_threads(world, [&](int rank, int world_size, tdist::StorePtr) {
      TCPStore store("127.0.0.1", TCPStoreOptions().port(port).timeout(10s));
      tdist::testing::check_store_across_ranks(store, rank, world_size, "");
    });
  }
}

TDIST_SCENARIO(tcp_store_ranks) {
  const int rank = tdist::testing::env_int("RANK", -1);
  const int world = tdist::testing::env_int("WORLD_SIZE", -1);
  const int port = tdist::testing::env_int("MASTER_PORT", -1);
  TCPStore store(std::getenv("MASTER_ADDR"),
                 TCPStoreOptions().port(port).is_server(rank == 0).num_workers(world).timeout(30s));
  tdist::testing::check_store_across_ranks(store, rank, world, "");
  // The server must outlive the clients' last requests.
  store.add("left", 1);
  if (rank == 0) {
    while (store.add("left", 0) < world) std::this_thread::sleep_for(5ms);
  }
}

TEST(TCPStore, RanksAsProcesses) {
  for (int world : {2, 4}) {
    tdist::testing::ProcessOptions options;
    options.timeout = 60s;
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("tcp_store_ranks", world, options));
  }
}

TEST(TCPStore, UnreachableMasterErrorNamesHostPortWithinTimeout) {
  const int port = tdist::testing::free_port();
  const auto start = std::chrono::steady_clock::now();
  try {
    TCPStore store("127.0.0.1", TCPStoreOptions().port(port).timeout(300ms));
    FAIL() << "connected to a port nobody listens on";
  } catch (const tdist::StoreError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << what;
    EXPECT_NE(what.find("MASTER_ADDR"), std::string::npos) << what;
    EXPECT_NE(what.find("300 ms"), std::string::npos) << what;
  }
  // Not a timing assertion on speed: only that the call gave up rather than hanging.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
}

TEST(TCPStore, ClientStartedBeforeItsServerSaysSoOnceAndKeepsWaiting) {
  const int port = tdist::testing::free_port();
  std::unique_ptr<TCPStore> server;
  std::thread late_server([&server, port] {
    std::this_thread::sleep_for(1500ms);
    server = std::make_unique<TCPStore>("127.0.0.1", server_options().port(port));
  });
  ::testing::internal::CaptureStderr();
  {
    TCPStore client("127.0.0.1", TCPStoreOptions()
                                     .port(port)
                                     .timeout(30s)
                                     .notice_after(200ms)
                                     .client_name("worker 7")
                                     .server_name("the coordinator"));
    late_server.join();
    client.set("k", std::string("v"));
    EXPECT_EQ(server->get_string("k"), "v");
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  const std::string notice =
      "worker 7: waiting for the store at 127.0.0.1:" + std::to_string(port) +
      " (the coordinator hosts it); 0 s so far, timeout 30 s";
  EXPECT_NE(said.find(notice), std::string::npos) << said;
  EXPECT_EQ(said.find("waiting for the store"), said.rfind("waiting for the store")) << said;
}

TEST(TCPStore, ClientWithTheNoticeOffSaysNothing) {
  const int port = tdist::testing::free_port();
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(TCPStore("127.0.0.1", TCPStoreOptions().port(port).timeout(600ms).notice_after(0ms)),
               tdist::StoreError);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(TCPStore, PortInUseIsAClearError) {
  TCPStore first("127.0.0.1", server_options());
  try {
    TCPStore second("127.0.0.1", server_options().port(first.port()));
    FAIL() << "two servers on one port";
  } catch (const tdist::StoreError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::to_string(first.port())), std::string::npos) << what;
    EXPECT_NE(what.find("already in use"), std::string::npos) << what;
  }
  // The first server is unaffected.
  first.set("still", std::string("ok"));
  EXPECT_EQ(first.get_string("still"), "ok");
}

TEST(TCPStore, ServerReportsWorkersThatNeverJoined) {
  try {
    TCPStore store("127.0.0.1", server_options().num_workers(3).timeout(300ms));
    FAIL() << "server returned without its workers";
  } catch (const tdist::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("only 1 of 3 workers"), std::string::npos) << e.what();
  }
}

TEST(TCPStore, ServerWaitsForWorkers) {
  const int port = tdist::testing::free_port();
  std::thread worker([&] {
    std::this_thread::sleep_for(50ms);
    TCPStore client("127.0.0.1", TCPStoreOptions().port(port).timeout(10s));
    client.set("worker", std::string("here"));
  });
  TCPStore server("127.0.0.1", server_options().port(port).num_workers(2));
  // Construction returned only after the worker joined.
  worker.join();
  EXPECT_EQ(server.get_string("worker"), "here");
  EXPECT_EQ(server.num_keys(), 1);  // bookkeeping keys are not counted
}

TEST(TCPStore, OversizedKeyOrValueIsRejectedBeforeSending) {
  TCPStore store("127.0.0.1", server_options().max_key_bytes(16).max_value_bytes(64));
  EXPECT_THROW(store.set(std::string(17, 'k'), std::string("v")), tdist::InvalidArgument);
  EXPECT_THROW(store.set("k", std::string(65, 'v')), tdist::InvalidArgument);
  store.set("k", std::string(64, 'v'));
  EXPECT_EQ(store.get_string("k").size(), 64u);
}

TEST(TCPStore, InvalidPortIsRejected) {
  EXPECT_THROW(TCPStore("127.0.0.1", TCPStoreOptions().port(70000)), tdist::InvalidArgument);
  EXPECT_THROW(TCPStore("127.0.0.1", TCPStoreOptions().port(0)), tdist::InvalidArgument);
}

bool can_connect(const std::string& ip, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                sizeof(text));
    if (std::string(text).rfind("127.", 0) != 0) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

TEST(TCPStore, BindsOnlyTheGivenAddress) {
  TCPStore store("127.0.0.1", server_options());
  EXPECT_TRUE(can_connect("127.0.0.1", store.port()));
  // 127.0.0.2 reaches this machine too, but not a socket bound to 127.0.0.1 only.
  EXPECT_FALSE(can_connect("127.0.0.2", store.port()));
  const std::string other = non_loopback_ipv4();
  if (!other.empty()) {
    EXPECT_FALSE(can_connect(other, store.port())) << other;
  }

  tdist::detail::TCPStoreServer server("127.0.0.1", 0, "", {});
  EXPECT_EQ(server.bound_address(), "127.0.0.1:" + std::to_string(server.port()));
}

TEST(TCPStore, BindAddressOptionWins) {
  // host names the address clients use; bind_address restricts the listener.
  TCPStore store("localhost", server_options().bind_address("127.0.0.1"));
  EXPECT_TRUE(can_connect("127.0.0.1", store.port()));
  EXPECT_FALSE(can_connect("127.0.0.2", store.port()));
  TCPStore client("localhost", TCPStoreOptions().port(store.port()).timeout(5s));
  client.set("x", std::string("1"));
  EXPECT_EQ(store.get_string("x"), "1");
}

TEST(TCPStore, ServerGoneIsAStoreErrorNotAHang) {
  auto server = std::make_unique<TCPStore>("127.0.0.1", server_options());
  TCPStore client("127.0.0.1", TCPStoreOptions().port(server->port()).timeout(2s));
  client.set("a", std::string("1"));
  server.reset();
  EXPECT_THROW(client.get("a"), tdist::Error);
}

}  // namespace

// c10d's extended store API (append, multi_get, multi_set) and queues on every kind of store:
// the single-caller contract, the base class's fallbacks, and queues shared by ranks as
// threads and as processes at world sizes 1-4.
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "store_contract.h"
#include "support/ranks.h"
#include "tdist/store/file_store.h"
#include "tdist/store/hash_store.h"
#include "tdist/store/prefix_store.h"
#include "tdist/store/tcp_store.h"

namespace {

using tdist::FileStore;
using tdist::HashStore;
using tdist::PrefixStore;
using tdist::TCPStore;
using tdist::TCPStoreOptions;
using tdist::testing::check_extended_contract;
using tdist::testing::server_options;
using namespace std::chrono_literals;

constexpr int kItemsPerRank = 25;

std::string extended_store_path() {
  return tdist::testing::make_temp_dir("tdist-extended") + "/store";
}

TEST(StoreExtendedApi, HashStore) {
  HashStore store(10s);
  check_extended_contract(store, "");
}

TEST(StoreExtendedApi, FileStore) {
  FileStore store(extended_store_path(), 1, 10s);
  check_extended_contract(store, "");
}

TEST(StoreExtendedApi, TCPStore) {
  TCPStore store("127.0.0.1", server_options());
  check_extended_contract(store, "");
}

TEST(StoreExtendedApi, TCPStoreClient) {
  TCPStore server("127.0.0.1", server_options());
  TCPStore client("127.0.0.1", TCPStoreOptions().port(server.port()).timeout(10s));
  check_extended_contract(client, "");
}

TEST(StoreExtendedApi, PrefixStoreOverEachKind) {
  std::vector<tdist::StorePtr> bases{std::make_shared<HashStore>(10s),
                                     std::make_shared<FileStore>(extended_store_path(), -1, 10s),
                                     std::make_shared<TCPStore>("127.0.0.1", server_options())};
  for (const auto& base : bases) {
    PrefixStore store("grp", base);
    check_extended_contract(store, "");
    // Everything landed under the prefix.
    EXPECT_TRUE(base->check({"grp/ap", "grp/m1"}));
    base->queue_push("grp/q", std::string("seen through the prefix"));
    EXPECT_EQ(store.queue_len("q"), 1);
    EXPECT_EQ(store.queue_pop("q"), tdist::testing::bytes("seen through the prefix"));
    EXPECT_EQ(base->queue_len("q"), 0);
  }
}

TEST(StoreExtendedApi, PrefixStoreBlocksForItsOwnTimeout) {
  auto base = std::make_shared<HashStore>(10s);
  PrefixStore store("g", base);
  store.set_timeout(100ms);
  try {
    store.queue_pop("empty");
    FAIL() << "pop of an empty queue returned";
  } catch (const tdist::TimeoutError& e) {
    tdist::testing::expect_mentions(e.what(), {"'g/empty'", "100 ms"});
  }
  EXPECT_THROW(store.multi_get({"missing"}), tdist::TimeoutError);
}

// A store that overrides only the core ops: the base class's bodies serve the extended API,
// and queues are refused by name.
class CoreOnlyStore : public tdist::Store {
 public:
  CoreOnlyStore() : Store(std::chrono::milliseconds(200)) {}
  void set(const std::string& k, const std::vector<uint8_t>& v) override { inner_.set(k, v); }
  std::vector<uint8_t> get(const std::string& k) override { return inner_.get(k); }
  int64_t add(const std::string& k, int64_t v) override { return inner_.add(k, v); }
  std::vector<uint8_t> compare_set(const std::string& k, const std::vector<uint8_t>& e,
                                   const std::vector<uint8_t>& d) override {
    return inner_.compare_set(k, e, d);
  }
  bool check(const std::vector<std::string>& keys) override { return inner_.check(keys); }
  bool delete_key(const std::string& k) override { return inner_.delete_key(k); }
  int64_t num_keys() override { return inner_.num_keys(); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds t) override {
    inner_.wait(keys, t);
  }
  using Store::set;
  using Store::wait;

 private:
  HashStore inner_{std::chrono::milliseconds(200)};
};

TEST(StoreExtendedApi, BaseClassBuildsTheExtendedApiFromTheCoreOps) {
  CoreOnlyStore store;
  store.append("a", std::string("po"));
  store.append("a", std::string("tato"));
  EXPECT_EQ(store.get_string("a"), "potato");
  store.multi_set({"x", "y"}, std::vector<std::string>{"1", "2"});
  EXPECT_EQ(
      store.multi_get({"y", "x"}),
      (std::vector<std::vector<uint8_t>>{tdist::testing::bytes("2"), tdist::testing::bytes("1")}));
  EXPECT_THROW(store.multi_get({"x", "never"}), tdist::TimeoutError);
  try {
    store.multi_set({"x"}, std::vector<std::string>{"1", "2", "3"});
    FAIL() << "mismatched multi_set returned";
  } catch (const tdist::InvalidArgument& e) {
    tdist::testing::expect_mentions(e.what(), {"1 keys", "3 values"});
  }
  try {
    store.queue_push("q", std::string("v"));
    FAIL() << "queue_push on a store without queues returned";
  } catch (const tdist::StoreError& e) {
    tdist::testing::expect_mentions(e.what(), {"queue_push('q')", "no queues"});
  }
  EXPECT_THROW(store.queue_pop("q"), tdist::StoreError);
  EXPECT_THROW(store.queue_len("q"), tdist::StoreError);
}

TEST(StoreExtendedApi, ConcurrentAppendsAllLand) {
  auto file = extended_store_path();
  TCPStore server("127.0.0.1", server_options());
  for (int kind = 0; kind < 3; ++kind) {
    auto shared = std::make_shared<HashStore>(10s);
    tdist::testing::run_ranks_as_threads(4, [&](int rank, int world, tdist::StorePtr) {
      std::shared_ptr<tdist::Store> store = shared;
      if (kind == 1) store = std::make_shared<FileStore>(file, -1, 10s);
      if (kind == 2) {
        store = std::make_shared<TCPStore>("127.0.0.1",
                                           TCPStoreOptions().port(server.port()).timeout(10s));
      }
      const std::string key = "log" + std::to_string(kind);
      for (int i = 0; i < 20; ++i) store->append(key, std::string(1, char('a' + rank)));
      store->add("appended" + std::to_string(kind), 1);
      store->wait({"appended" + std::to_string(kind)});
      while (store->add("appended" + std::to_string(kind), 0) < world) {
        std::this_thread::sleep_for(1ms);
      }
      const std::string log = store->get_string(key);
      EXPECT_EQ(log.size(), 80u);
      for (int r = 0; r < world; ++r) EXPECT_EQ(std::count(log.begin(), log.end(), 'a' + r), 20);
    });
  }
}

TEST(StoreExtendedApi, QueueSharedByThreadRanks) {
  for (int world : {1, 2, 3, 4}) {
    // One HashStore shared by every thread.
    tdist::testing::run_ranks_as_threads(
        world, [&](int rank, int world_size, tdist::StorePtr store) {
          auto popped = tdist::testing::push_pop_across_ranks(*store, rank, kItemsPerRank, "q");
          tdist::testing::check_every_item_popped_once(*store, rank, world_size, kItemsPerRank,
                                                       popped, "");
        });
    // A TCPStore client per thread.
    TCPStore host("127.0.0.1", server_options());
    tdist::testing::run_ranks_as_threads(world, [&](int rank, int world_size, tdist::StorePtr) {
      TCPStore store("127.0.0.1", TCPStoreOptions().port(host.port()).timeout(10s));
      auto popped = tdist::testing::push_pop_across_ranks(store, rank, kItemsPerRank, "q");
      tdist::testing::check_every_item_popped_once(store, rank, world_size, kItemsPerRank, popped,
                                                   "");
    });
    // A FileStore per thread on one file.
    const std::string path = extended_store_path();
    tdist::testing::run_ranks_as_threads(world, [&](int rank, int world_size, tdist::StorePtr) {
      FileStore store(path, world_size, 30s);
      auto popped = tdist::testing::push_pop_across_ranks(store, rank, kItemsPerRank, "q");
      tdist::testing::check_every_item_popped_once(store, rank, world_size, kItemsPerRank, popped,
                                                   "");
      // Nobody leaves (and the last one removes the file) before everyone has checked.
      store.add("checked", 1);
      while (store.add("checked", 0) < world_size) std::this_thread::sleep_for(1ms);
    });
  }
}

TEST(StoreExtendedApi, ManyBlockedPopsEachTakeOneItem) {
  TCPStore server("127.0.0.1", server_options());
  TCPStore client("127.0.0.1", TCPStoreOptions().port(server.port()).timeout(10s));
  std::vector<std::thread> poppers;
  std::mutex mutex;
  std::vector<std::string> got;
  for (int i = 0; i < 4; ++i) {
    poppers.emplace_back([&] {
      auto item = client.queue_pop("jobs");
      std::lock_guard<std::mutex> lock(mutex);
      got.emplace_back(item.begin(), item.end());
    });
  }
  std::this_thread::sleep_for(50ms);
  for (int i = 0; i < 4; ++i) server.queue_push("jobs", std::to_string(i));
  for (auto& t : poppers) t.join();
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{"0", "1", "2", "3"}));
  EXPECT_EQ(server.queue_len("jobs"), 0);
}

TEST(StoreExtendedApi, TCPStoreMultiSetOverTheValueLimitIsRefusedBeforeSending) {
  TCPStore store("127.0.0.1", server_options().max_value_bytes(64));
  try {
    store.multi_set({"a", "b"},
                    std::vector<std::string>{std::string(40, 'a'), std::string(40, 'b')});
    FAIL() << "multi_set over the limit returned";
  } catch (const tdist::InvalidArgument& e) {
    tdist::testing::expect_mentions(e.what(), {"80 bytes", "64", "max_value_bytes"});
  }
  EXPECT_FALSE(store.check({"a"}));
  store.multi_set({"a", "b"}, std::vector<std::string>{std::string(32, 'a'), std::string(32, 'b')});
  EXPECT_EQ(store.multi_get({"a", "b"}).size(), 2u);
  EXPECT_THROW(store.queue_push("q", std::string(65, 'v')), tdist::InvalidArgument);
  EXPECT_THROW(store.append("a", std::string(65, 'v')), tdist::InvalidArgument);
}

TEST(StoreExtendedApi, FileStoreQueueSurvivesReopening) {
  const std::string path = extended_store_path();
  {
    FileStore first(path, -1, 10s);
    first.queue_push("q", std::string("1"));
    first.queue_push("q", std::string("2"));
    first.queue_push("q", std::string("3"));
    EXPECT_EQ(first.queue_pop("q"), tdist::testing::bytes("1"));
  }
  // A second process (here a second FileStore) replays pushes and pops from the file.
  FileStore second(path, -1, 10s);
  EXPECT_EQ(second.queue_len("q"), 2);
  EXPECT_EQ(second.queue_pop("q"), tdist::testing::bytes("2"));
}

// Ranks as processes: each pushes and pops on one queue of a TCP or file store.
TDIST_SCENARIO(store_queue_ranks) {
  const int rank = tdist::testing::env_int("RANK", -1);
  const int world = tdist::testing::env_int("WORLD_SIZE", -1);
  std::unique_ptr<tdist::Store> store;
  const std::string file = tdist::testing::env_str("TDIST_TEST_FILE");
  if (file.empty()) {
    store = std::make_unique<TCPStore>(std::getenv("MASTER_ADDR"),
                                       TCPStoreOptions()
                                           .port(tdist::testing::env_int("MASTER_PORT", -1))
                                           .is_server(rank == 0)
                                           .num_workers(world)
                                           .timeout(30s));
  } else {
    store = std::make_unique<FileStore>(file, world, 30s);
  }
  auto popped = tdist::testing::push_pop_across_ranks(*store, rank, kItemsPerRank, "q");
  tdist::testing::check_every_item_popped_once(*store, rank, world, kItemsPerRank, popped, "");
  // The TCP server (rank 0) and the file must outlive every rank's last request.
  store->add("left", 1);
  if (rank == 0 || !file.empty()) {
    while (store->add("left", 0) < world) std::this_thread::sleep_for(5ms);
  }
}

TEST(StoreExtendedApi, QueueSharedByProcessRanks) {
  for (bool file : {false, true}) {
    for (int world : {1, 2, 3, 4}) {
      tdist::testing::ProcessOptions options;
      options.timeout = 60s;
      const std::string path = extended_store_path();
      if (file) options.env["TDIST_TEST_FILE"] = path;
      SCOPED_TRACE((file ? "FileStore, world " : "TCPStore, world ") + std::to_string(world));
      tdist::testing::expect_all_ok(
          tdist::testing::run_ranks_as_processes("store_queue_ranks", world, options));
      if (file) {
        EXPECT_FALSE(std::filesystem::exists(path));
      }
    }
  }
}

}  // namespace

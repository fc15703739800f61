#include <gtest/gtest.h>

#include "support/ranks.h"
#include "tdist/error.h"
#include "tdist/store/hash_store.h"
#include "tdist/store/prefix_store.h"

namespace {

TEST(HashStore, SetGetAddAcrossThreadRanks) {
  tdist::testing::run_ranks_as_threads(4, [](int rank, int world, tdist::StorePtr store) {
    store->set("key" + std::to_string(rank), std::to_string(rank * 10));
    store->add("counter", rank + 1);
    store->set("done" + std::to_string(rank), std::string("1"));
    for (int r = 0; r < world; ++r) store->wait({"done" + std::to_string(r)});
    // Every rank's add is visible once all ranks are done: 1 + 2 + ... + world.
    EXPECT_EQ(store->add("counter", 0), world * (world + 1) / 2);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(store->get_string("key" + std::to_string(r)), std::to_string(r * 10));
    }
  });
}

TEST(HashStore, WaitTimesOutNamingMissingKey) {
  tdist::HashStore store;
  try {
    store.wait({"never"}, std::chrono::milliseconds(50));
    FAIL() << "expected TimeoutError";
  } catch (const tdist::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos);
  }
}

TEST(PrefixStore, KeysDoNotCollide) {
  auto base = std::make_shared<tdist::HashStore>();
  tdist::PrefixStore a("a", base), b("b", base);
  a.set("k", std::string("1"));
  b.set("k", std::string("2"));
  EXPECT_EQ(a.get_string("k"), "1");
  EXPECT_EQ(b.get_string("k"), "2");
  EXPECT_TRUE(base->check({"a/k", "b/k"}));
}

}  // namespace

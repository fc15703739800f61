#pragma once

// The Store contract, checked the same way on every kind of store.

#include <gtest/gtest.h>

#include <thread>

#include "tdist/error.h"
#include "tdist/store/store.h"

namespace tdist::testing {

inline std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

/// Every op on one store, single caller. Keys are prefixed so stores may be shared.
inline void check_store_contract(Store& store, const std::string& p) {
  const int64_t keys_before = store.num_keys();
  store.set(p + "a", std::string("alpha"));
  EXPECT_EQ(store.get_string(p + "a"), "alpha");
  store.set(p + "a", bytes(std::string("\0\xff\x01", 3)));  // overwrite, binary value
  EXPECT_EQ(store.get(p + "a"), bytes(std::string("\0\xff\x01", 3)));
  store.set(p + "empty", std::vector<uint8_t>{});
  EXPECT_TRUE(store.get(p + "empty").empty());

  EXPECT_EQ(store.add(p + "n", 5), 5);
  EXPECT_EQ(store.add(p + "n", -2), 3);
  EXPECT_EQ(store.add(p + "n", 0), 3);
  EXPECT_EQ(store.get_string(p + "n"), "3");

  // compare_set: absent + empty expected sets; mismatch returns current; match swaps.
  EXPECT_EQ(store.compare_set(p + "cas", {}, bytes("one")), bytes("one"));
  EXPECT_EQ(store.compare_set(p + "cas", bytes("zzz"), bytes("two")), bytes("one"));
  EXPECT_EQ(store.compare_set(p + "cas", bytes("one"), bytes("two")), bytes("two"));
  EXPECT_EQ(store.get_string(p + "cas"), "two");
  EXPECT_EQ(store.compare_set(p + "absent", bytes("x"), bytes("y")), bytes("x"));
  EXPECT_FALSE(store.check({p + "absent"}));

  EXPECT_TRUE(store.check({p + "a", p + "n", p + "cas"}));
  EXPECT_FALSE(store.check({p + "a", p + "missing"}));
  EXPECT_TRUE(store.check({}));

  EXPECT_EQ(store.num_keys(), keys_before + 4);
  EXPECT_TRUE(store.delete_key(p + "a"));
  EXPECT_FALSE(store.delete_key(p + "a"));
  EXPECT_FALSE(store.check({p + "a"}));
  EXPECT_EQ(store.num_keys(), keys_before + 3);

  store.wait({p + "n", p + "cas"}, std::chrono::milliseconds(1000));
  try {
    store.wait({p + "n", p + "never-set"}, std::chrono::milliseconds(100));
    ADD_FAILURE() << "wait on a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find(p + "never-set"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find(p + "n,"), std::string::npos) << e.what();
  }

  // A blocking get is released by a later set from another thread.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    store.set(p + "late", std::string("here"));
  });
  auto old = store.timeout();
  store.set_timeout(std::chrono::milliseconds(10000));
  EXPECT_EQ(store.get_string(p + "late"), "here");
  store.set_timeout(old);
  setter.join();

  // get on a missing key times out with the key named.
  store.set_timeout(std::chrono::milliseconds(100));
  try {
    store.get(p + "nobody");
    ADD_FAILURE() << "get on a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find(p + "nobody"), std::string::npos) << e.what();
  }
  store.set_timeout(old);
}

/// Ranks share the store: every rank writes, adds and reads everyone's keys.
inline void check_store_across_ranks(Store& store, int rank, int world, const std::string& p) {
  store.set(p + "rank" + std::to_string(rank), std::to_string(rank * 7));
  const int64_t mine = store.add(p + "counter", rank + 1);
  EXPECT_GE(mine, rank + 1);
  std::vector<std::string> all;
  for (int r = 0; r < world; ++r) all.push_back(p + "rank" + std::to_string(r));
  store.wait(all, std::chrono::milliseconds(30000));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(store.get_string(p + "rank" + std::to_string(r)), std::to_string(r * 7));
  }
  // Everyone's add has happened once every rank reports done.
  store.set(p + "done" + std::to_string(rank), std::string("1"));
  std::vector<std::string> done;
  for (int r = 0; r < world; ++r) done.push_back(p + "done" + std::to_string(r));
  store.wait(done, std::chrono::milliseconds(30000));
  EXPECT_EQ(store.add(p + "counter", 0), static_cast<int64_t>(world) * (world + 1) / 2);
  // Exactly one rank wins a compare_set race.
  auto got = store.compare_set(p + "leader", {}, bytes(std::to_string(rank)));
  store.add(p + "cas_done", 1);
  if (got == bytes(std::to_string(rank))) store.add(p + "winners", 1);
  store.set(p + "cas_finished" + std::to_string(rank), std::string("1"));
  std::vector<std::string> fin;
  for (int r = 0; r < world; ++r) fin.push_back(p + "cas_finished" + std::to_string(r));
  store.wait(fin, std::chrono::milliseconds(30000));
  EXPECT_EQ(store.add(p + "winners", 0), 1);
}

}  // namespace tdist::testing

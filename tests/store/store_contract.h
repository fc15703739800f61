#pragma once

// The Store contract, checked the same way on every kind of store.

#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <thread>

#include "tdist/error.h"
#include "tdist/store/store.h"
#include "tdist/store/tcp_store.h"

namespace tdist::testing {

/// A TCPStore server on a free port with a 10 s timeout.
inline TCPStoreOptions server_options() {
  return TCPStoreOptions().port(0).is_server(true).timeout(std::chrono::seconds(10));
}

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

/// Throws unless `what` contains every one of `parts` (so a failure prints the message).
inline void expect_mentions(const std::string& what, std::initializer_list<std::string> parts) {
  for (const auto& part : parts) {
    EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
  }
}

/// c10d's extended API (append, multi_get, multi_set) and queues on one store, single caller
/// (plus a helper thread for the blocking calls). Semantics are those of PyTorch 2.11's
/// TCPStore and HashStore.
inline void check_extended_contract(Store& store, const std::string& p) {
  using std::chrono::milliseconds;
  const auto old_timeout = store.timeout();
  EXPECT_TRUE(store.has_extended_api());

  // append creates a missing key, then appends (binary-safe).
  store.append(p + "ap", std::string("po"));
  store.append(p + "ap", std::string("tato"));
  EXPECT_EQ(store.get_string(p + "ap"), "potato");
  store.append(p + "ap", bytes(std::string("\0\xff", 2)));
  EXPECT_EQ(store.get(p + "ap"), bytes(std::string("potato\0\xff", 8)));
  store.append(p + "ap_empty", std::vector<uint8_t>{});
  EXPECT_TRUE(store.check({p + "ap_empty"}));
  EXPECT_TRUE(store.get(p + "ap_empty").empty());

  // multi_set / multi_get in order; an empty list is fine.
  store.multi_set({p + "m1", p + "m2", p + "m3"}, std::vector<std::string>{"one", "", "three"});
  EXPECT_EQ(store.multi_get({p + "m3", p + "m1", p + "m2"}),
            (std::vector<std::vector<uint8_t>>{bytes("three"), bytes("one"), bytes("")}));
  EXPECT_TRUE(store.multi_get({}).empty());
  store.multi_set({}, std::vector<std::vector<uint8_t>>{});
  store.multi_set({p + "m1"}, std::vector<std::string>{"uno"});  // overwrites
  EXPECT_EQ(store.get_string(p + "m1"), "uno");
  try {
    store.multi_set({p + "x", p + "y"}, std::vector<std::string>{"only one"});
    ADD_FAILURE() << "multi_set with 2 keys and 1 value returned";
  } catch (const InvalidArgument& e) {
    expect_mentions(e.what(), {"2 keys", "1 values"});
  }
  EXPECT_FALSE(store.check({p + "x"}));

  // multi_get waits for every key like get, then times out naming only the missing ones.
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    store.set(p + "late1", std::string("a"));
    store.set(p + "late2", std::string("b"));
  });
  store.set_timeout(milliseconds(10000));
  EXPECT_EQ(store.multi_get({p + "late1", p + "late2"}),
            (std::vector<std::vector<uint8_t>>{bytes("a"), bytes("b")}));
  setter.join();
  store.set_timeout(milliseconds(100));
  try {
    store.multi_get({p + "m1", p + "nobody"});
    ADD_FAILURE() << "multi_get of a missing key returned";
  } catch (const TimeoutError& e) {
    expect_mentions(e.what(), {p + "nobody", "100 ms"});
    EXPECT_EQ(std::string(e.what()).find(p + "m1,"), std::string::npos) << e.what();
  }
  store.set_timeout(old_timeout);

  // Queues: FIFO, a length, 0 for a queue never pushed.
  const int64_t keys_before = store.num_keys();
  EXPECT_EQ(store.queue_len(p + "q"), 0);
  store.queue_push(p + "q", std::string("x"));
  store.queue_push(p + "q", bytes(std::string("\0y", 2)));
  store.queue_push(p + "q", std::vector<uint8_t>{});
  EXPECT_EQ(store.queue_len(p + "q"), 3);
  // check and wait see a non-empty queue; num_keys does not count it.
  EXPECT_TRUE(store.check({p + "q"}));
  store.wait({p + "q"}, milliseconds(1000));
  EXPECT_EQ(store.num_keys(), keys_before);
  EXPECT_EQ(store.queue_pop(p + "q"), bytes("x"));
  EXPECT_EQ(store.queue_pop(p + "q", false), bytes(std::string("\0y", 2)));
  EXPECT_TRUE(store.queue_pop(p + "q").empty());
  EXPECT_EQ(store.queue_len(p + "q"), 0);
  EXPECT_FALSE(store.check({p + "q"}));

  // Popped past its end: at once without blocking, after the timeout with it.
  try {
    store.queue_pop(p + "q", false);
    ADD_FAILURE() << "non-blocking pop of an empty queue returned";
  } catch (const QueueEmptyError& e) {
    expect_mentions(e.what(), {p + "q'", "empty"});
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    store.queue_pop(p + "q", true, milliseconds(150));
    ADD_FAILURE() << "blocking pop of an empty queue returned";
  } catch (const TimeoutError& e) {
    expect_mentions(e.what(), {p + "q'", "150 ms"});
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(140));
  store.set_timeout(milliseconds(120));
  try {
    store.queue_pop(p + "q");  // the store's timeout
    ADD_FAILURE() << "blocking pop of an empty queue returned";
  } catch (const TimeoutError& e) {
    expect_mentions(e.what(), {p + "q'", "120 ms"});
  }

  // A blocked pop is released by a later push from another thread.
  store.set_timeout(milliseconds(10000));
  std::thread pusher([&] {
    std::this_thread::sleep_for(milliseconds(50));
    store.queue_push(p + "q", std::string("late"));
  });
  EXPECT_EQ(store.queue_pop(p + "q"), bytes("late"));
  pusher.join();
  // So is a wait on the queue's name.
  std::thread pusher2([&] {
    std::this_thread::sleep_for(milliseconds(50));
    store.queue_push(p + "qw", std::string("w"));
  });
  store.wait({p + "qw"});
  pusher2.join();
  EXPECT_EQ(store.queue_len(p + "qw"), 1);
  EXPECT_EQ(store.queue_pop(p + "qw"), bytes("w"));
  store.set_timeout(old_timeout);

  // A queue and a key of one name are independent: get reads the value, pop the queue,
  // delete_key removes only the value.
  store.set(p + "both", std::string("value"));
  store.queue_push(p + "both", std::string("item"));
  EXPECT_EQ(store.get_string(p + "both"), "value");
  EXPECT_EQ(store.queue_len(p + "both"), 1);
  EXPECT_TRUE(store.delete_key(p + "both"));
  EXPECT_TRUE(store.check({p + "both"}));  // the queue still holds an item
  EXPECT_EQ(store.queue_pop(p + "both"), bytes("item"));
  EXPECT_FALSE(store.check({p + "both"}));
  EXPECT_FALSE(store.delete_key(p + "both"));
}

/// Every rank pushes `per_rank` items tagged with its rank to one queue and pops `per_rank`
/// items; returns what this rank popped. Every rank pops as many as it pushed, so every
/// blocking pop is eventually served.
inline std::vector<std::string> push_pop_across_ranks(Store& store, int rank, int per_rank,
                                                      const std::string& queue) {
  std::vector<std::string> popped;
  for (int i = 0; i < per_rank; ++i) {
    store.queue_push(queue, std::to_string(rank) + ":" + std::to_string(i));
    auto item = store.queue_pop(queue);
    popped.emplace_back(item.begin(), item.end());
  }
  return popped;
}

/// Publishes this rank's popped items and checks, once every rank has, that each item pushed
/// to the queue p + "q" was popped exactly once.
inline void check_every_item_popped_once(Store& store, int rank, int world, int per_rank,
                                         const std::vector<std::string>& popped,
                                         const std::string& p) {
  std::string joined;
  for (const auto& item : popped) joined += item + ";";
  store.set(p + "popped" + std::to_string(rank), joined);
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(p + "popped" + std::to_string(r));
  std::map<int, std::vector<int>> seen;  // pusher -> its items in the order popped
  int total = 0;
  for (const auto& value : store.multi_get(keys)) {
    std::string text(value.begin(), value.end());
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t colon = text.find(':', pos), semi = text.find(';', pos);
      const int who = std::stoi(text.substr(pos, colon - pos));
      const int i = std::stoi(text.substr(colon + 1, semi - colon - 1));
      seen[who].push_back(i);
      ++total;
      pos = semi + 1;
    }
  }
  EXPECT_EQ(total, world * per_rank);
  for (int r = 0; r < world; ++r) {
    auto items = seen[r];
    std::sort(items.begin(), items.end());
    std::vector<int> want(per_rank);
    for (int i = 0; i < per_rank; ++i) want[i] = i;
    EXPECT_EQ(items, want) << "items of rank " << r << " (rank " << rank << " checking)";
  }
  EXPECT_EQ(store.queue_len(p + "q"), 0);
}

}  // namespace tdist::testing

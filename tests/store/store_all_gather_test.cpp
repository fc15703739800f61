#include <gtest/gtest.h>

#include <atomic>

#include "support/ranks.h"
#include "tdist/error.h"
#include "tdist/store/hash_store.h"
#include "tdist/store/store_all_gather.h"

namespace tdist {
namespace {

StoreAllGatherOptions participant(int rank, int world) {
  return StoreAllGatherOptions().prefix("t").rank(rank).world_size(world).timeout(
      std::chrono::seconds(30));
}

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

TEST(StoreAllGather, EveryRankGetsEveryValueInRankOrderRoundAfterRound) {
  for (int world : {1, 2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    testing::run_ranks_as_threads(world, [](int rank, int n, StorePtr store) {
      for (uint64_t round = 0; round < 5; ++round) {
        // Uneven lengths, an empty value among them.
        const std::string mine(static_cast<size_t>(rank) * round, static_cast<char>('a' + rank));
        const auto all = store_all_gather(*store, round, bytes(mine), participant(rank, n));
        ASSERT_EQ(all.size(), static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(all[r],
                    bytes(std::string(static_cast<size_t>(r) * round, static_cast<char>('a' + r))));
        }
      }
    });
  }
}

TEST(StoreAllGather, EachRankDeletesItsKeyOfARoundOnceEveryoneReadIt) {
  testing::run_ranks_as_threads(3, [](int rank, int n, StorePtr store) {
    const auto o = participant(rank, n);
    for (uint64_t round = 0; round < 6; ++round) store_all_gather(*store, round, bytes("x"), o);
    // This rank removed its own keys up to round 4; round 5's stays until the next round.
    EXPECT_TRUE(store->check({store_all_gather_key(o, 5, rank)}));
    for (uint64_t round = 0; round < 5; ++round) {
      EXPECT_FALSE(store->check({store_all_gather_key(o, round, rank)})) << "round " << round;
    }
  });
}

TEST(StoreAllGather, AnAbsentRankIsNamedAfterTheTimeout) {
  std::atomic<int> timed_out{0};
  testing::run_ranks_as_threads(4, [&](int rank, int n, StorePtr store) {
    if (rank == 1 || rank == 3) return;  // never arrive
    try {
      store_all_gather(
          *store, 0, bytes("x"),
          participant(rank, n).timeout(std::chrono::milliseconds(200)).purpose("probe"));
      ADD_FAILURE() << "rank " << rank << " returned without ranks 1 and 3";
    } catch (const TimeoutError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("probe: rank " + std::to_string(rank)), std::string::npos) << msg;
      EXPECT_NE(msg.find("rank(s) 1, 3 to arrive"), std::string::npos) << msg;
      ++timed_out;
    }
  });
  EXPECT_EQ(timed_out.load(), 2);
}

TEST(StoreAllGather, ARankOutsideTheWorldIsRefused) {
  HashStore store;
  EXPECT_THROW(store_all_gather(store, 0, bytes("x"), participant(2, 2)), InvalidArgument);
  EXPECT_THROW(store_all_gather(store, 0, bytes("x"), participant(0, 0)), InvalidArgument);
  EXPECT_EQ(store.num_keys(), 0) << "a refused call must not write";
}

}  // namespace
}  // namespace tdist

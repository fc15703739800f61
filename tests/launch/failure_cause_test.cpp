// Reading which rank a failed worker lost from its last output lines, in the forms tdist's
// collectives print (Note [Blaming the lost peer]).
#include <gtest/gtest.h>

#include "launch/failure_cause.h"

namespace tdist::launch::detail {
namespace {

TEST(LostPeerNamedIn, TheTcpPairsForm) {
  EXPECT_EQ(lost_peer_named_in({"noise",
                                "  what():  rank 0: gloo all_reduce #1 (receiving from rank 3): "
                                "lost the connection to rank 3 (the peer died or closed the "
                                "group); the group is now broken: [pair.cc:589] Read error"}),
            3);
}

TEST(LostPeerNamedIn, TheSharedMemoryForm) {
  EXPECT_EQ(lost_peer_named_in({"rank 2: gloo broadcast #4 waiting for rank 12 in shared memory: "
                                "lost the connection to it (the peer died or closed the group)"}),
            12);
}

TEST(LostPeerNamedIn, TheGroupsFirstFailureWinsOverTheCascade) {
  EXPECT_EQ(lost_peer_named_in({"rank 0: gloo all_reduce #1 (receiving from rank 1): lost the "
                                "connection to rank 1 (the peer died or closed the group); the "
                                "group is now broken: reset; first failure in the group: rank 1: "
                                "gloo all_reduce #1 (receiving from rank 3): lost the connection "
                                "to rank 3 (the peer died or closed the group)"}),
            3);
  // A first failure that names no lost peer (a timeout) leaves the line's own peer.
  EXPECT_EQ(lost_peer_named_in({"rank 0: lost the connection to rank 1 (the peer died); first "
                                "failure in the group: rank 2: timed out after 100 ms waiting "
                                "for rank 4"}),
            1);
}

TEST(LostPeerNamedIn, TheLastLineThatNamesOneCounts) {
  EXPECT_EQ(lost_peer_named_in({"lost the connection to rank 5 (caught, retried)",
                                "lost the connection to rank 6 (the peer died)", "exiting"}),
            6);
}

TEST(LostPeerNamedIn, NothingNamedIsNothing) {
  EXPECT_EQ(lost_peer_named_in({}), std::nullopt);
  EXPECT_EQ(lost_peer_named_in({"boom: the disk is on fire", "Segmentation fault"}), std::nullopt);
  EXPECT_EQ(lost_peer_named_in({"lost the connection to the store"}), std::nullopt);
  EXPECT_EQ(lost_peer_named_in({"lost the connection to rank x"}), std::nullopt);
  EXPECT_EQ(lost_peer_named_in({"lost the connection to it"}), std::nullopt);
}

}  // namespace
}  // namespace tdist::launch::detail

#pragma once

// Which rank a failed worker blames, read from its last output lines (internal).
//
// Note [Blaming the lost peer]
// When a rank fails, its peers see their connections to it close and fail too, often
// first: a LibTorch program that exits with an error closes its sockets in its static
// destructors, then spends ~0.2 s unregistering operators before the process is gone,
// while a peer that lost it aborts at once. The first worker the launcher reaps is then a
// consequence, not the cause. tdist's collectives say so in a fixed form, "lost the
// connection to rank N" (src/gloo/exchange.cpp) or "waiting for rank N in shared memory:
// lost the connection to it" (src/gloo/same_host_channel.cpp), and a rank that only saw the
// cascade adds "first failure in the group: <that rank's error>". The launcher follows
// these names to the rank that actually failed (ElasticAgent::find_cause). N is the rank in
// the failed collective's group: the global rank for the world group, which is where a dead
// process is seen first.

#include <optional>
#include <string>
#include <vector>

namespace tdist::launch::detail {

/// The rank these output lines say the worker lost its connection to, preferring the group's
/// first failure when the lines quote it; nullopt when they name none.
std::optional<int> lost_peer_named_in(const std::vector<std::string>& lines);

}  // namespace tdist::launch::detail

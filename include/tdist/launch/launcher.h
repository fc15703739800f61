#pragma once

// tdistrun's entry point: parse the flags, meet the other nodes, run the agent.

#include <memory>

#include "tdist/launch/launch_config.h"
#include "tdist/launch/rendezvous.h"

namespace tdist::launch {

/// The rendezvous a config asks for: LocalRendezvous for one node, else a StoreRendezvous
/// over a TCPStore at the endpoint, hosted by node rank 0 (static) or by the launcher that
/// first binds the endpoint on its own machine (c10d).
std::unique_ptr<Rendezvous> make_rendezvous(const LaunchConfig& config);

/// main() of tdistrun; returns the process exit code.
int launcher_main(int argc, const char* const* argv);

}  // namespace tdist::launch

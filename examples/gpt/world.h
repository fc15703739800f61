#pragma once

// This process's place among the ranks, and the few collectives the trainer itself needs
// (averaging a loss, gathering memory figures). World size 1 needs no process group.

#include <cstdint>
#include <vector>

namespace gpt {

struct World {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  bool distributed() const { return world_size > 1; }
  bool is_main() const { return rank == 0; }
};

/// Reads RANK / WORLD_SIZE / LOCAL_RANK (set by tdistrun or by gpt's own spawner) and, with
/// more than one rank, joins the default process group (env://, gloo). Throws
/// tdist::InvalidArgument for inconsistent variables and when this build has no tdist::comm.
World init_world(int timeout_s);
/// Leaves the process group (no-op for world size 1).
void shutdown_world(const World& world);

/// Mean of `values` element-wise over all ranks (identity for world size 1).
std::vector<double> all_mean(const World& world, const std::vector<double>& values);
/// Every rank's value, in rank order (on every rank).
std::vector<double> all_gather_values(const World& world, double value);
void barrier(const World& world);

}  // namespace gpt

#pragma once

// This process's place among the ranks, and the few collectives the trainer itself needs
// (averaging a loss, gathering memory figures). World size 1 needs no process group.

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace gpt {

struct World {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  c10::Device device = c10::Device(c10::kCPU);  ///< where this rank computes (--device)
  bool distributed() const { return world_size > 1; }
  bool is_main() const { return rank == 0; }
};

/// Reads RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE (set by tdistrun or by gpt's own
/// spawner), resolves `device` ("cpu", "cuda", "auto": gpt/device.h) and, with more than one
/// rank, joins the default process group (env://; gloo, with nccl for CUDA tensors on CUDA,
/// bound to the rank's GPU). Throws tdist::InvalidArgument for inconsistent variables, a
/// device that cannot be had, and when this build has no tdist::comm.
World init_world(int timeout_s, const std::string& device = "cpu");
/// One rank alone: joins a process group of one (in-process store), for what needs a group
/// even then (FSDP). No-op when a group exists.
void ensure_process_group(const World& world);

/// Leaves the process group, if any.
void shutdown_world(const World& world);

/// Mean of `values` element-wise over all ranks (identity for world size 1).
std::vector<double> all_mean(const World& world, const std::vector<double>& values);
/// Every rank's value, in rank order (on every rank).
std::vector<double> all_gather_values(const World& world, double value);
void barrier(const World& world);

}  // namespace gpt

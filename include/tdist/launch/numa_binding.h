#pragma once

// --numa-binding: which CPUs each local rank's worker may run on (torchrun's affinity modes).
//
// Note [NUMA binding without GPUs]: torchrun binds local rank i near GPU i (the GPU's PCI
// NUMA node). tdistrun's workers need no GPU, so local ranks go round-robin over the NUMA
// nodes that have CPUs: local rank i uses node i % N (nodes in id order), and the ranks on
// one node are that node's ranks i / N = 0, 1, ... Then, as torchrun does, per mode:
//   node          every allowed CPU of the node
//   socket        every allowed CPU of every node on the node's socket (physical_package_id)
//   exclusive     a disjoint share of the node's allowed physical cores (all their hardware
//                 threads) per rank on the node; lower ranks get the remainder's extra core
//   core-complex  the CPUs of one cache complex of the node (the CPUs sharing the largest
//                 cache, usually an L3), fullest complexes first, round-robin if fewer
// "Allowed" is the launcher's own affinity (a cgroup or taskset limit); a rank left with no
// CPU is an error that names the rank and the node, never a silent fallback.

#include <set>
#include <string>
#include <vector>

#include "tdist/launch/cpu_topology.h"

namespace tdist::launch {

enum class NumaBinding { kNone, kNode, kSocket, kExclusive, kCoreComplex };

/// "node", "socket", "exclusive" or "core-complex"; anything else is an InvalidArgument
/// naming the flag and the allowed values.
NumaBinding parse_numa_binding(const std::string& text);

/// The flag value of `binding` ("" for kNone).
std::string numa_binding_name(NumaBinding binding);

/// The CPU set of each local rank 0..nproc-1 under `binding` (Note [NUMA binding without
/// GPUs]), each a subset of `allowed`. Throws InvalidArgument when a rank gets no CPU.
std::vector<std::set<int>> numa_cpu_sets(NumaBinding binding, int nproc,
                                         const CpuTopology& topology, const std::set<int>& allowed);

}  // namespace tdist::launch

#include "tdist/launch/numa_binding.h"

#include <algorithm>
#include <iterator>
#include <map>

#include "tdist/error.h"

namespace tdist::launch {

namespace {

// Where a local rank goes: its node, and which of that node's ranks it is.
struct Placement {
  int node = 0;
  int index_on_node = 0;  // 0 for the node's first rank
  int ranks_on_node = 1;
};

Placement place(int local_rank, int nproc, const std::vector<int>& node_ids) {
  const int n = static_cast<int>(node_ids.size());
  Placement p;
  p.node = node_ids[local_rank % n];
  p.index_on_node = local_rank / n;
  p.ranks_on_node = nproc / n + (local_rank % n < nproc % n ? 1 : 0);
  return p;
}

std::set<int> intersect(const std::set<int>& a, const std::set<int>& b) {
  std::set<int> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

// The node's CPUs this launcher may use; none is the error of Note [NUMA binding without
// GPUs].
std::set<int> allowed_on_node(const CpuTopology& topology, const std::set<int>& allowed, int node,
                              int local_rank, NumaBinding binding) {
  const auto& cpus = topology.nodes().at(node);
  auto usable = intersect(cpus, allowed);
  if (usable.empty()) {
    TDIST_THROW(InvalidArgument,
                "tdistrun: --numa-binding " + numa_binding_name(binding) + ": local rank " +
                    std::to_string(local_rank) + " goes to NUMA node " + std::to_string(node) +
                    " (CPUs " + format_cpu_list(cpus) +
                    "), but this launcher may only run on CPUs " + format_cpu_list(allowed) +
                    "; run fewer workers per node, widen the launcher's CPU set (taskset, "
                    "cgroup cpuset), or drop --numa-binding");
  }
  return usable;
}

std::set<int> socket_cpus(const CpuTopology& topology, const std::set<int>& allowed,
                          const std::set<int>& node_cpus) {
  const int socket = topology.socket_of(*node_cpus.begin());
  std::set<int> out;
  for (const auto& [node, cpus] : topology.nodes()) {
    for (int cpu : intersect(cpus, allowed)) {
      if (topology.socket_of(cpu) == socket) out.insert(cpu);
    }
  }
  return out;
}

// Consecutive physical cores, an equal share per rank on the node (the first
// cores % ranks ranks one more), as torchrun's exclusive mode.
std::set<int> exclusive_cpus(const CpuTopology& topology, const std::set<int>& node_cpus,
                             const Placement& p, int local_rank) {
  std::map<int, std::set<int>> cores;
  for (int cpu : node_cpus) cores[topology.core_of(cpu)].insert(cpu);
  const int count = static_cast<int>(cores.size());
  if (count < p.ranks_on_node) {
    TDIST_THROW(InvalidArgument,
                "tdistrun: --numa-binding exclusive: NUMA node " + std::to_string(p.node) +
                    " has " + std::to_string(count) + " usable physical core(s) (CPUs " +
                    format_cpu_list(node_cpus) + ") for " + std::to_string(p.ranks_on_node) +
                    " local ranks, including local rank " + std::to_string(local_rank) +
                    "; run fewer workers per node or use --numa-binding node");
  }
  const int share = count / p.ranks_on_node, extra = count % p.ranks_on_node;
  const int begin = p.index_on_node * share + std::min(p.index_on_node, extra);
  const int end = begin + share + (p.index_on_node < extra ? 1 : 0);
  std::set<int> out;
  auto it = std::next(cores.begin(), begin);
  for (int i = begin; i < end; ++i, ++it) out.insert(it->second.begin(), it->second.end());
  return out;
}

// The fullest cache complexes first (ties: lowest CPU), one per rank, round-robin.
std::set<int> core_complex_cpus(const CpuTopology& topology, const std::set<int>& node_cpus,
                                const Placement& p) {
  std::map<int, std::set<int>> complexes;
  for (int cpu : node_cpus) complexes[topology.cache_complex_of(cpu)].insert(cpu);
  std::vector<std::set<int>> ordered;
  for (auto& [lowest, cpus] : complexes) ordered.push_back(std::move(cpus));
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto& a, const auto& b) { return a.size() > b.size(); });
  return ordered[p.index_on_node % ordered.size()];
}

}  // namespace

NumaBinding parse_numa_binding(const std::string& text) {
  for (auto b : {NumaBinding::kNode, NumaBinding::kSocket, NumaBinding::kExclusive,
                 NumaBinding::kCoreComplex}) {
    if (text == numa_binding_name(b)) return b;
  }
  TDIST_THROW(InvalidArgument,
              "tdistrun: --numa-binding must be node, socket, exclusive or "
              "core-complex, got '" +
                  text + "'");
}

std::string numa_binding_name(NumaBinding binding) {
  switch (binding) {
    case NumaBinding::kNone:
      return "";
    case NumaBinding::kNode:
      return "node";
    case NumaBinding::kSocket:
      return "socket";
    case NumaBinding::kExclusive:
      return "exclusive";
    case NumaBinding::kCoreComplex:
      return "core-complex";
  }
  return "";
}

std::vector<std::set<int>> numa_cpu_sets(NumaBinding binding, int nproc,
                                         const CpuTopology& topology,
                                         const std::set<int>& allowed) {
  std::vector<std::set<int>> sets(static_cast<size_t>(std::max(nproc, 0)));
  if (binding == NumaBinding::kNone) return sets;
  std::vector<int> node_ids;
  for (const auto& [node, cpus] : topology.nodes()) node_ids.push_back(node);
  TDIST_CHECK_ARG(!node_ids.empty(), "tdistrun: --numa-binding: no NUMA node has CPUs");
  for (int rank = 0; rank < nproc; ++rank) {
    const Placement p = place(rank, nproc, node_ids);
    const auto node_cpus = allowed_on_node(topology, allowed, p.node, rank, binding);
    switch (binding) {
      case NumaBinding::kNode:
        sets[rank] = node_cpus;
        break;
      case NumaBinding::kSocket:
        sets[rank] = socket_cpus(topology, allowed, node_cpus);
        break;
      case NumaBinding::kExclusive:
        sets[rank] = exclusive_cpus(topology, node_cpus, p, rank);
        break;
      case NumaBinding::kCoreComplex:
        sets[rank] = core_complex_cpus(topology, node_cpus, p);
        break;
      case NumaBinding::kNone:
        break;
    }
  }
  return sets;
}

}  // namespace tdist::launch

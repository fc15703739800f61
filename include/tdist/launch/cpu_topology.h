#pragma once

// The CPU layout tdistrun's --numa-binding needs: NUMA nodes and their CPUs, and for each CPU
// its socket, its physical core and the largest cache it shares. Read from sysfs under a
// root directory ("/sys" on a real machine; tests build a fake tree in a temp dir).

#include <map>
#include <set>
#include <string>

namespace tdist::launch {

/// Parses a kernel CPU list ("0-3,8,10-11"); throws InvalidArgument naming `what` when
/// malformed.
std::set<int> parse_cpu_list(const std::string& text, const std::string& what);

/// The kernel's notation for `cpus`: {0,1,2,5} -> "0-2,5"; "" for none.
std::string format_cpu_list(const std::set<int>& cpus);

/// The CPUs this process may run on (sched_getaffinity).
std::set<int> allowed_cpus();

class CpuTopology {
 public:
  /// Reads `sysfs_root`/devices/system/{node,cpu}. Without NUMA nodes in sysfs (a kernel
  /// built without NUMA) every online CPU is on node 0. Throws Error when nothing is readable.
  static CpuTopology read(const std::string& sysfs_root);

  /// NUMA nodes that have CPUs, by node id, with all their CPUs (allowed or not).
  const std::map<int, std::set<int>>& nodes() const { return nodes_; }
  /// The CPU's physical_package_id (0 when sysfs does not say).
  int socket_of(int cpu) const;
  /// The lowest CPU of the CPU's thread_siblings_list: one id per physical core.
  int core_of(int cpu) const;
  /// The lowest CPU sharing the CPU's highest-level data or unified cache (its L3 on
  /// current x86): one id per core complex.
  int cache_complex_of(int cpu) const;

 private:
  void read_cpu(const std::string& cpu_dir, int cpu);

  std::map<int, std::set<int>> nodes_;
  std::map<int, int> socket_, core_, complex_;
};

}  // namespace tdist::launch

// --numa-binding's CPU sets on a fake sysfs tree (2 sockets x 2 NUMA nodes, 4 cores x 2
// threads per node, 2 L3 complexes per node, and a memory-only node), for every mode and
// several worker counts, including more local ranks than nodes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "launch/run_process.h"
#include "tdist/launch/numa_binding.h"

namespace tdist::launch {
namespace {

namespace fs = std::filesystem;

constexpr int kNodes = 4, kCoresPerNode = 4, kThreads = kNodes * kCoresPerNode;

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

// Linux numbering: CPUs 0-15 are each core's first thread, 16-31 their siblings. Node n has
// cores 4n..4n+3; socket n / 2; complex A = cores 4n, 4n+1, complex B = 4n+2, 4n+3.
std::set<int> node_cpus(int n) {
  std::set<int> cpus;
  for (int c = 4 * n; c < 4 * n + kCoresPerNode; ++c) cpus.insert({c, c + kThreads});
  return cpus;
}
std::set<int> core_cpus(int core) {
  return {core, core + kThreads};
}
std::set<int> complex_cpus(int n, int which) {
  int first = 4 * n + 2 * which;
  return {first, first + 1, first + kThreads, first + 1 + kThreads};
}
std::set<int> unite(std::initializer_list<std::set<int>> sets) {
  std::set<int> out;
  for (const auto& s : sets) out.insert(s.begin(), s.end());
  return out;
}

void write_cache(const fs::path& cpu_dir, int index, int level, const std::string& type,
                 const std::set<int>& shared) {
  auto dir = cpu_dir / "cache" / ("index" + std::to_string(index));
  write(dir / "level", std::to_string(level));
  write(dir / "type", type);
  write(dir / "shared_cpu_list", format_cpu_list(shared));
}

std::string fake_sysfs() {
  fs::path root = testing::temp_dir();
  auto system = root / "devices" / "system";
  for (int n = 0; n < kNodes; ++n) {
    write(system / "node" / ("node" + std::to_string(n)) / "cpulist",
          format_cpu_list(node_cpus(n)));
    for (int cpu : node_cpus(n)) {
      const int core = cpu % kThreads;
      auto dir = system / "cpu" / ("cpu" + std::to_string(cpu));
      write(dir / "topology" / "physical_package_id", std::to_string(n / 2));
      write(dir / "topology" / "thread_siblings_list", format_cpu_list(core_cpus(core)));
      write_cache(dir, 0, 1, "Data", core_cpus(core));
      write_cache(dir, 1, 1, "Instruction", core_cpus(core));
      write_cache(dir, 2, 2, "Unified", core_cpus(core));
      write_cache(dir, 3, 3, "Unified", complex_cpus(n, (core % 4) / 2));
      // An instruction cache is never the complex, whatever its level.
      write_cache(dir, 4, 4, "Instruction", node_cpus(n));
    }
  }
  write(system / "node" / "node4" / "cpulist", "");  // memory only (CXL): never bound to
  return root.string();
}

std::set<int> all_cpus() {
  std::set<int> all;
  for (int n = 0; n < kNodes; ++n) all.merge(node_cpus(n));
  return all;
}

class NumaCpuSets : public ::testing::Test {
 protected:
  std::vector<std::set<int>> sets(NumaBinding mode, int nproc,
                                  const std::set<int>& allowed = all_cpus()) {
    return numa_cpu_sets(mode, nproc, CpuTopology::read(root_), allowed);
  }
  std::string error(NumaBinding mode, int nproc, const std::set<int>& allowed) {
    try {
      sets(mode, nproc, allowed);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  }
  std::string root_ = fake_sysfs();
};

using Mode = NumaBinding;

TEST(CpuList, ParsesAndFormatsKernelNotation) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n", "t"), (std::set<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(parse_cpu_list("", "t"), std::set<int>{});
  EXPECT_THROW(parse_cpu_list("0-x", "t"), InvalidArgument);
  EXPECT_THROW(parse_cpu_list("3-1", "t"), InvalidArgument);
}

TEST_F(NumaCpuSets, TopologySkipsMemoryOnlyNodesAndReadsEveryLevel) {
  auto topo = CpuTopology::read(root_);
  ASSERT_EQ(topo.nodes().size(), 4u);
  EXPECT_EQ(topo.nodes().at(3), node_cpus(3));
  EXPECT_EQ(topo.socket_of(5), 0);
  EXPECT_EQ(topo.socket_of(9), 1);
  EXPECT_EQ(topo.core_of(21), 5);
  EXPECT_EQ(topo.cache_complex_of(23), 6);  // core 7: node 1's complex B, lowest CPU 6
}

TEST_F(NumaCpuSets, NodeModeIsRoundRobinOverNodes) {
  for (int nproc : {1, 2, 3, 4, 6, 8, 9}) {
    auto s = sets(Mode::kNode, nproc);
    ASSERT_EQ(static_cast<int>(s.size()), nproc);
    for (int rank = 0; rank < nproc; ++rank) {
      EXPECT_EQ(s[rank], node_cpus(rank % kNodes)) << "nproc " << nproc << " rank " << rank;
    }
  }
}

TEST_F(NumaCpuSets, SocketModeTakesEveryNodeOfTheSocket) {
  for (int nproc : {1, 2, 4, 5, 8}) {
    auto s = sets(Mode::kSocket, nproc);
    for (int rank = 0; rank < nproc; ++rank) {
      int socket = (rank % kNodes) / 2;
      EXPECT_EQ(s[rank], unite({node_cpus(2 * socket), node_cpus(2 * socket + 1)}))
          << "nproc " << nproc << " rank " << rank;
    }
  }
}

TEST_F(NumaCpuSets, ExclusiveModeSplitsEachNodesCoresDisjointly) {
  // Up to 4 ranks: one per node, the whole node.
  for (int nproc : {1, 4}) {
    auto s = sets(Mode::kExclusive, nproc);
    for (int rank = 0; rank < nproc; ++rank) EXPECT_EQ(s[rank], node_cpus(rank));
  }
  // 8 ranks: ranks n and n + 4 share node n, two cores each.
  auto s8 = sets(Mode::kExclusive, 8);
  for (int n = 0; n < kNodes; ++n) {
    EXPECT_EQ(s8[n], unite({core_cpus(4 * n), core_cpus(4 * n + 1)})) << "rank " << n;
    EXPECT_EQ(s8[n + 4], unite({core_cpus(4 * n + 2), core_cpus(4 * n + 3)})) << "rank " << n + 4;
  }
  // 10 ranks: nodes 0 and 1 hold three (2 + 1 + 1 cores), nodes 2 and 3 two (2 + 2).
  auto s10 = sets(Mode::kExclusive, 10);
  EXPECT_EQ(s10[0], unite({core_cpus(0), core_cpus(1)}));
  EXPECT_EQ(s10[4], core_cpus(2));
  EXPECT_EQ(s10[8], core_cpus(3));
  EXPECT_EQ(s10[9], core_cpus(7));
  EXPECT_EQ(s10[3], unite({core_cpus(12), core_cpus(13)}));
  EXPECT_EQ(s10[7], unite({core_cpus(14), core_cpus(15)}));
  for (int nproc : {4, 8, 10, 16}) {
    std::set<int> seen;
    for (const auto& cpus : sets(Mode::kExclusive, nproc)) {
      for (int cpu : cpus) EXPECT_TRUE(seen.insert(cpu).second) << "CPU " << cpu << " shared";
    }
    EXPECT_EQ(seen, all_cpus()) << "nproc " << nproc << ": every CPU goes to some rank";
  }
}

TEST_F(NumaCpuSets, ExclusiveModeNeedsACorePerRank) {
  auto message = error(Mode::kExclusive, 20, all_cpus());  // 5 ranks on 4-core nodes
  EXPECT_NE(message.find("NUMA node 0 has 4 usable physical core(s)"), std::string::npos)
      << message;
  EXPECT_NE(message.find("5 local ranks"), std::string::npos) << message;
}

TEST_F(NumaCpuSets, CoreComplexModeGivesEachRankOneL3) {
  for (int nproc : {1, 4, 8, 12, 16}) {
    auto s = sets(Mode::kCoreComplex, nproc);
    for (int rank = 0; rank < nproc; ++rank) {
      int node = rank % kNodes, index_on_node = rank / kNodes;
      EXPECT_EQ(s[rank], complex_cpus(node, index_on_node % 2))
          << "nproc " << nproc << " rank " << rank;
    }
  }
}

TEST_F(NumaCpuSets, OnlyTheLaunchersAllowedCpusAreUsed) {
  auto allowed = all_cpus();
  allowed.erase(0);  // node 0's complex A now has 3 CPUs: complex B is fuller, so first
  auto cc = sets(Mode::kCoreComplex, 8, allowed);
  EXPECT_EQ(cc[0], complex_cpus(0, 1));
  EXPECT_EQ(cc[4], (std::set<int>{1, 16, 17}));
  auto node = sets(Mode::kNode, 1, allowed);
  EXPECT_EQ(node[0].count(0), 0u);
  EXPECT_EQ(node[0].size(), 7u);
}

TEST_F(NumaCpuSets, ARankWithNoAllowedCpuIsAnErrorNamingRankAndNode) {
  auto allowed = unite({node_cpus(0), node_cpus(1)});  // e.g. a cpuset of socket 0
  EXPECT_EQ(sets(Mode::kNode, 2, allowed).size(), 2u);
  for (auto mode : {Mode::kNode, Mode::kSocket, Mode::kExclusive, Mode::kCoreComplex}) {
    auto message = error(mode, 3, allowed);
    EXPECT_NE(message.find("local rank 2 goes to NUMA node 2 (CPUs 8-11,24-27)"), std::string::npos)
        << message;
    EXPECT_NE(message.find("may only run on CPUs 0-7,16-23"), std::string::npos) << message;
  }
}

TEST_F(NumaCpuSets, WithoutNumaInSysfsEveryOnlineCpuIsNodeZero) {
  fs::path root = testing::temp_dir();
  write(root / "devices" / "system" / "cpu" / "online", "0-5");
  auto s = numa_cpu_sets(Mode::kNode, 3, CpuTopology::read(root.string()), {0, 1, 2, 3, 4, 5, 9});
  for (const auto& cpus : s) EXPECT_EQ(cpus, (std::set<int>{0, 1, 2, 3, 4, 5}));
}

TEST(NumaBindingFlag, ParsesTorchrunsModesAndNamesThemOnError) {
  EXPECT_EQ(parse_numa_binding("core-complex"), Mode::kCoreComplex);
  EXPECT_EQ(numa_binding_name(Mode::kExclusive), "exclusive");
  try {
    parse_numa_binding("numa");
    FAIL() << "accepted 'numa'";
  } catch (const InvalidArgument& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("--numa-binding must be node, socket, exclusive or core-complex, "
                           "got 'numa'"),
              std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace tdist::launch

#include "tdist/launch/cpu_topology.h"

#include <sched.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "tdist/error.h"

namespace tdist::launch {

namespace fs = std::filesystem;

namespace {

// The first line of a sysfs file; nullopt when it cannot be read.
std::optional<std::string> read_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

int parse_cpu_id(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    int value = std::stoi(text, &used);
    if (used == text.size() && value >= 0) return value;
  } catch (const std::exception&) {
  }
  TDIST_THROW(InvalidArgument, "tdistrun: malformed CPU list in " + what + ": '" + text + "'");
}

// "node3" -> 3, anything else -> -1.
int numbered_entry(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return -1;
  const std::string digits = name.substr(prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoi(digits);
}

// The CPU's highest-level data or unified cache: the CPUs sharing it (empty when sysfs has
// no cache information). Instruction caches are skipped, as PyTorch's binding does.
std::set<int> largest_cache_sharers(const fs::path& cache_dir) {
  std::error_code ec;
  int best_level = -1;
  std::set<int> sharers;
  for (const auto& entry : fs::directory_iterator(cache_dir, ec)) {
    if (numbered_entry(entry.path().filename().string(), "index") < 0) continue;
    auto type = read_line(entry.path() / "type");
    if (type && *type != "Unified" && *type != "Data") continue;
    auto level = read_line(entry.path() / "level");
    auto shared = read_line(entry.path() / "shared_cpu_list");
    if (!level || !shared) continue;
    int l = parse_cpu_id(*level, (entry.path() / "level").string());
    if (l <= best_level) continue;
    best_level = l;
    sharers = parse_cpu_list(*shared, (entry.path() / "shared_cpu_list").string());
  }
  return sharers;
}

}  // namespace

std::set<int> parse_cpu_list(const std::string& text, const std::string& what) {
  std::set<int> cpus;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t\n"));
    item.erase(item.find_last_not_of(" \t\n") + 1);
    if (item.empty()) continue;
    auto dash = item.find('-');
    int first = parse_cpu_id(item.substr(0, dash), what);
    int last = dash == std::string::npos ? first : parse_cpu_id(item.substr(dash + 1), what);
    if (last < first) TDIST_THROW(InvalidArgument, "tdistrun: bad CPU range in " + what);
    for (int cpu = first; cpu <= last; ++cpu) cpus.insert(cpu);
  }
  return cpus;
}

std::string format_cpu_list(const std::set<int>& cpus) {
  std::string out;
  for (auto it = cpus.begin(); it != cpus.end();) {
    int first = *it, last = *it;
    while (++it != cpus.end() && *it == last + 1) last = *it;
    if (!out.empty()) out += ",";
    out += std::to_string(first);
    if (last != first) out += "-" + std::to_string(last);
  }
  return out;
}

std::set<int> allowed_cpus() {
  std::set<int> cpus;
  // Sized for machines beyond CPU_SETSIZE (1024 CPUs).
  for (int size = 1024; size <= (1 << 16); size *= 4) {
    cpu_set_t* set = CPU_ALLOC(size);
    const size_t bytes = CPU_ALLOC_SIZE(size);
    const bool ok = sched_getaffinity(0, bytes, set) == 0;
    if (ok) {
      for (int cpu = 0; cpu < size; ++cpu) {
        if (CPU_ISSET_S(cpu, bytes, set)) cpus.insert(cpu);
      }
    }
    CPU_FREE(set);
    if (ok) return cpus;
  }
  TDIST_THROW(Error, "tdistrun: sched_getaffinity failed: cannot tell which CPUs to bind");
}

CpuTopology CpuTopology::read(const std::string& sysfs_root) {
  CpuTopology topology;
  const fs::path system = fs::path(sysfs_root) / "devices" / "system";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(system / "node", ec)) {
    int node = numbered_entry(entry.path().filename().string(), "node");
    if (node < 0) continue;
    auto list = read_line(entry.path() / "cpulist");
    if (!list) continue;
    auto cpus = parse_cpu_list(*list, (entry.path() / "cpulist").string());
    // Memory-only nodes (CXL, HBM) have no CPUs to bind to.
    if (!cpus.empty()) topology.nodes_[node] = std::move(cpus);
  }
  if (topology.nodes_.empty()) {
    auto online = read_line(system / "cpu" / "online");
    if (!online) {
      TDIST_THROW(Error, "tdistrun: --numa-binding: cannot read the CPU layout under " +
                             system.string() + " (no node*/cpulist and no cpu/online)");
    }
    topology.nodes_[0] = parse_cpu_list(*online, (system / "cpu" / "online").string());
  }
  for (const auto& [node, cpus] : topology.nodes_) {
    for (int cpu : cpus) topology.read_cpu((system / "cpu" / ("cpu" + std::to_string(cpu))), cpu);
  }
  return topology;
}

void CpuTopology::read_cpu(const std::string& cpu_dir, int cpu) {
  const fs::path dir(cpu_dir);
  auto package = read_line(dir / "topology" / "physical_package_id");
  // Some VMs report -1; an unreadable id means one socket, as PyTorch assumes for nodes.
  try {
    socket_[cpu] = package ? std::stoi(*package) : 0;
  } catch (const std::exception&) {
    socket_[cpu] = 0;
  }
  auto siblings = read_line(dir / "topology" / "thread_siblings_list");
  auto threads =
      siblings ? parse_cpu_list(*siblings, (dir / "topology").string()) : std::set<int>{};
  core_[cpu] = threads.empty() ? cpu : *threads.begin();
  auto sharers = largest_cache_sharers(dir / "cache");
  complex_[cpu] = sharers.empty() ? cpu : *sharers.begin();
}

int CpuTopology::socket_of(int cpu) const {
  auto it = socket_.find(cpu);
  return it == socket_.end() ? 0 : it->second;
}

int CpuTopology::core_of(int cpu) const {
  auto it = core_.find(cpu);
  return it == core_.end() ? cpu : it->second;
}

int CpuTopology::cache_complex_of(int cpu) const {
  auto it = complex_.find(cpu);
  return it == complex_.end() ? cpu : it->second;
}

}  // namespace tdist::launch

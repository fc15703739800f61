#pragma once

// tdistrun's configuration: torchrun's flags, parsed and validated in one place.

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tdist/launch/numa_binding.h"

namespace tdist::launch {

/// Which worker streams a --redirects/--tee value selects (torchrun's Std: 0 none, 1 stdout,
/// 2 stderr, 3 both), either for every local rank ("3") or per local rank ("0:1,1:2").
struct StreamSelection {
  static constexpr int kNone = 0;
  static constexpr int kStdout = 1;
  static constexpr int kStderr = 2;
  static constexpr int kAll = 3;

  int all = kNone;
  std::map<int, int> per_local_rank;

  int for_local_rank(int local_rank) const;
  bool selects(int local_rank, int stream) const {
    return (for_local_rank(local_rank) & stream) != 0;
  }
  /// Parses "3" or "0:1,1:2"; throws InvalidArgument.
  static StreamSelection parse(const std::string& text, const std::string& flag);
};

/// How nodes find each other. kNone: one node, no store at all.
enum class RendezvousMode {
  kNone,     // single node: no rendezvous store
  kStatic,   // --node-rank fixes each node's group rank; node 0 hosts the store
  kDynamic,  // group ranks by join order; the endpoint's host hosts the store
};

struct LaunchConfig {
  int nproc_per_node = 1;
  int min_nodes = 1;
  int max_nodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool master_port_given = false;
  std::string rdzv_backend = "static";
  std::string rdzv_host;  // from --rdzv-endpoint (or --master-addr for static)
  int rdzv_port = 29400;
  std::string rdzv_id = "none";
  /// Whole rendezvous (all nodes joined) must finish within this.
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  /// Elastic (--nnodes MIN:MAX): after MIN nodes joined, wait this long for more.
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  /// Node 0 keeps the store alive this long for the others to read the outcome.
  std::chrono::milliseconds exit_barrier_timeout{std::chrono::seconds(60)};
  /// Note [Agent keep-alives]: every agent of a multi-node job beats this often; a node
  /// (or the store) silent for keep_alive_max_attempt beats ends the round, naming it.
  std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(1)};
  int keep_alive_max_attempt = 5;
  bool standalone = false;
  int max_restarts = 0;
  std::chrono::milliseconds monitor_interval{100};
  /// Grace period between SIGTERM and SIGKILL when stopping workers.
  std::chrono::milliseconds stop_timeout{std::chrono::seconds(30)};
  std::string log_dir;
  StreamSelection redirects;
  StreamSelection tee;
  /// Local ranks whose output reaches the console (empty: all).
  std::set<int> local_ranks_filter;
  std::string role = "default";
  std::string local_addr;
  /// Give workers a fresh random store secret (TDIST_STORE_SECRET_FILE) unless the
  /// launcher's environment already carries one.
  bool store_secret = true;
  /// Lines of a failed worker's output quoted in the failure summary.
  int summary_lines = 20;
  /// How this node's workers are started: "fork" (one process each, the default) or
  /// "mpirun" (one `mpirun -n <nproc_per_node>` child, so the workers form one MPI world;
  /// single node only; see src/launch/mpirun_launch.h).
  std::string launcher = "fork";
  /// --launcher mpirun: the mpirun program and extra arguments placed before the program.
  std::string mpirun = "mpirun";
  std::vector<std::string> mpirun_args;
  /// --numa-binding: the CPUs each local rank's worker is bound to (Note [NUMA binding
  /// without GPUs] in numa_binding.h); kNone leaves the launcher's affinity to the workers.
  NumaBinding numa_binding = NumaBinding::kNone;

  std::string program;
  std::vector<std::string> args;

  RendezvousMode rendezvous_mode() const;
  bool is_elastic() const { return min_nodes != max_nodes; }
  /// How long a node or the store may stay silent (Note [Agent keep-alives]).
  std::chrono::milliseconds keep_alive_window() const {
    return keep_alive_interval * keep_alive_max_attempt;
  }
};

/// Result of parsing the command line: a config to run, or an exit code with the text to
/// print (--help, a usage error).
struct ParsedArgs {
  std::optional<LaunchConfig> config;
  int exit_code = 0;
  std::string message;
};

/// Parses torchrun-compatible arguments (argv[0] is the program name). Never throws.
ParsedArgs parse_launch_args(int argc, const char* const* argv);

/// Number of workers for --nproc-per-node auto/cpu/gpu (cores or visible GPUs).
int resolve_nproc(const std::string& value);

}  // namespace tdist::launch

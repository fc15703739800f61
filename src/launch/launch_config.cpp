#include "tdist/launch/launch_config.h"

#include <sched.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "tdist/error.h"

namespace tdist::launch {

namespace {

int parse_int(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    long value = std::stol(text, &used);
    if (used == text.size()) return static_cast<int>(value);
  } catch (const std::exception&) {
  }
  TDIST_THROW(InvalidArgument, "tdistrun: " + what + " must be an integer, got '" + text + "'");
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, sep)) parts.push_back(part);
  return parts;
}

std::chrono::milliseconds seconds_to_ms(double seconds, const std::string& what) {
  TDIST_CHECK_ARG(std::isfinite(seconds) && seconds >= 0,
                  "tdistrun: " + what + " must be a non-negative number of seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000.0)));
}

int visible_gpus() {
  int count = 0;
  for (int i = 0; i < 64; ++i) {
    if (std::filesystem::exists("/dev/nvidia" + std::to_string(i))) ++count;
  }
  return count;
}

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

// "host:port", "[v6]:port" or "host" (default port).
void parse_endpoint(const std::string& text, int default_port, std::string* host, int* port) {
  std::string h = text;
  int p = default_port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    TDIST_CHECK_ARG(close != std::string::npos, "tdistrun: bad --rdzv-endpoint '" + text + "'");
    h = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      TDIST_CHECK_ARG(text[close + 1] == ':', "tdistrun: bad --rdzv-endpoint '" + text + "'");
      p = parse_int(text.substr(close + 2), "the --rdzv-endpoint port");
    }
  } else if (auto colon = text.rfind(':'); colon != std::string::npos) {
    h = text.substr(0, colon);
    p = parse_int(text.substr(colon + 1), "the --rdzv-endpoint port");
  }
  TDIST_CHECK_ARG(!h.empty(), "tdistrun: --rdzv-endpoint '" + text + "' names no host");
  TDIST_CHECK_ARG(p >= 0 && p < 65536, "tdistrun: port out of range in '" + text + "'");
  *host = h;
  *port = p;
}

const char* kFooter = R"(
Every worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS and
TDIST_STORE_SECRET_FILE (a fresh 0600 secret for the job's store; see --no-store-secret).
Output lines are prefixed "[rank N]: ". A failing worker stops the others (SIGTERM, then
SIGKILL after --stop-timeout) and restarts the whole job on every node, up to
--max-restarts times. Examples:
  tdistrun --standalone --nproc-per-node 4 ./train --epochs 3
  tdistrun --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 ./train
  tdistrun --nnodes 1:4 --rdzv-endpoint 10.0.0.1:29400 --rdzv-id job7 ./train
With --launcher mpirun the workers of the node are started by one
`mpirun -n NPROC --oversubscribe --bind-to none` child instead (same environment, output,
logs, failure summary and restarts), so init_process_group("mpi") works:
  tdistrun --standalone --nproc-per-node 2 --launcher mpirun ./train --backend mpi
See docs/launcher.md.)";

}  // namespace

int StreamSelection::for_local_rank(int local_rank) const {
  auto it = per_local_rank.find(local_rank);
  return it == per_local_rank.end() ? all : it->second;
}

StreamSelection StreamSelection::parse(const std::string& text, const std::string& flag) {
  StreamSelection selection;
  auto check = [&](int v) {
    TDIST_CHECK_ARG(v >= kNone && v <= kAll,
                    "tdistrun: " + flag +
                        " values are 0 (none), 1 (stdout), 2 (stderr) or 3 "
                        "(both), got '" +
                        text + "'");
    return v;
  };
  if (text.find(':') == std::string::npos) {
    selection.all = check(parse_int(text, flag));
    return selection;
  }
  for (const auto& item : split(text, ',')) {
    auto colon = item.find(':');
    TDIST_CHECK_ARG(colon != std::string::npos,
                    "tdistrun: " + flag + " expects N or LOCAL_RANK:N,..., got '" + text + "'");
    int rank = parse_int(item.substr(0, colon), flag + " local rank");
    selection.per_local_rank[rank] = check(parse_int(item.substr(colon + 1), flag));
  }
  return selection;
}

RendezvousMode LaunchConfig::rendezvous_mode() const {
  if (max_nodes <= 1) return RendezvousMode::kNone;
  return rdzv_backend == "static" ? RendezvousMode::kStatic : RendezvousMode::kDynamic;
}

int resolve_nproc(const std::string& value) {
  if (value == "cpu") return usable_cores();
  if (value == "gpu") {
    int gpus = visible_gpus();
    TDIST_CHECK_ARG(gpus > 0, "tdistrun: --nproc-per-node gpu, but no GPU is visible");
    return gpus;
  }
  if (value == "auto") {
    int gpus = visible_gpus();
    return gpus > 0 ? gpus : usable_cores();
  }
  int n = parse_int(value, "--nproc-per-node (a number, auto, cpu or gpu)");
  TDIST_CHECK_ARG(n >= 1, "tdistrun: --nproc-per-node must be at least 1, got " + value);
  return n;
}

namespace {

// The flags whose text is checked and converted after parsing; the others go straight into
// the LaunchConfig.
struct RawLaunchArgs {
  std::string nnodes = "1", nproc = "1", rdzv_endpoint, rdzv_conf, redirects = "0", tee = "0";
  std::string ranks_filter, start_method = "spawn", rdzv_backend, mpirun_args, numa_binding;
  double monitor_interval = 0.1, stop_timeout = 30.0;
  bool no_python = false, module = false, no_secret = false;
  CLI::Option* master_port = nullptr;
};

void add_launch_options(CLI::App& app, RawLaunchArgs& raw, LaunchConfig& c) {
  app.add_option("--nnodes", raw.nnodes, "Number of nodes, N or MIN:MAX (elastic)")
      ->capture_default_str();
  app.add_option("--nproc-per-node,--nproc_per_node", raw.nproc,
                 "Workers per node: a number, auto (GPUs, else cores), cpu or gpu")
      ->capture_default_str();
  app.add_option("--node-rank,--node_rank", c.node_rank,
                 "This node's rank (static rendezvous; node 0 hosts the store)")
      ->capture_default_str();
  app.add_option("--master-addr,--master_addr", c.master_addr,
                 "Address of node 0 (static rendezvous)")
      ->capture_default_str();
  raw.master_port = app.add_option("--master-port,--master_port", c.master_port,
                                   "Port on node 0: the store's (multi-node) or the workers' "
                                   "MASTER_PORT (single node)")
                        ->capture_default_str();
  app.add_option("--rdzv-backend,--rdzv_backend", raw.rdzv_backend,
                 "static (fixed --node-rank) or c10d (ranks by join order); default: c10d "
                 "with --rdzv-endpoint, else static");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", raw.rdzv_endpoint,
                 "host[:port] of the rendezvous store (default port 29400)");
  app.add_option("--rdzv-id,--rdzv_id", c.rdzv_id, "Job id, the same on every node")
      ->capture_default_str();
  app.add_option("--rdzv-conf,--rdzv_conf", raw.rdzv_conf,
                 "key=value,...: join_timeout, last_call_timeout, close_timeout, "
                 "keep_alive_interval (seconds), keep_alive_max_attempt");
  app.add_flag("--standalone", c.standalone,
               "Single node, rendezvous on localhost with a free port");
  app.add_option("--max-restarts,--max_restarts", c.max_restarts,
                 "Restart the whole job up to this many times after a failure")
      ->capture_default_str();
  app.add_option("--monitor-interval,--monitor_interval", raw.monitor_interval,
                 "Seconds between checks of the other nodes")
      ->capture_default_str();
  app.add_option("--stop-timeout,--stop_timeout", raw.stop_timeout,
                 "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->capture_default_str();
  app.add_option("--log-dir,--log_dir", c.log_dir,
                 "Write each rank's stdout/stderr to LOG_DIR/RUN_ID/attempt_K/rank_N/");
  app.add_option("-r,--redirects", raw.redirects,
                 "Streams sent only to the log files: 0 none, 1 stdout, 2 stderr, 3 both, or "
                 "per local rank 0:1,1:2");
  app.add_option("-t,--tee", raw.tee, "Streams sent to both console and log files (same syntax)");
  app.add_option("--local-ranks-filter,--local_ranks_filter", raw.ranks_filter,
                 "Only these local ranks reach the console, e.g. 0,1");
  app.add_option("--role", c.role, "Role name of the workers (ROLE_NAME)")->capture_default_str();
  app.add_option("--local-addr,--local_addr", c.local_addr,
                 "This node's address as the others reach it (MASTER_ADDR when it is node 0)");
  app.add_option("--numa-binding,--numa_binding", raw.numa_binding,
                 "Bind each local rank to CPUs: node, socket, exclusive or core-complex "
                 "(local rank i on NUMA node i % nodes; see docs/launcher.md)");
  app.add_option("--start-method,--start_method", raw.start_method,
                 "Accepted for torchrun compatibility (workers are always exec'd)");
  app.add_flag("--no-python,--no_python", raw.no_python,
               "Accepted for torchrun compatibility (the program is always executed directly)");
  app.add_flag("-m,--module", raw.module, "Not supported: tdistrun runs executables");
  app.add_flag("--no-store-secret", raw.no_secret,
               "Do not create TDIST_STORE_SECRET_FILE for the workers");
  app.add_option("--launcher", c.launcher,
                 "fork: one process per worker; mpirun: start this node's workers through "
                 "one `mpirun -n NPROC` so they form one MPI world (init_process_group(\"mpi\"); "
                 "single node only)")
      ->capture_default_str();
  app.add_option("--mpirun", c.mpirun, "--launcher mpirun: the mpirun program to run")
      ->capture_default_str();
  app.add_option("--mpirun-args", raw.mpirun_args,
                 "--launcher mpirun: extra mpirun arguments, space-separated (e.g. "
                 "\"--mca btl self,vader\")");
}

// The program and its arguments: what CLI11 left after tdistrun's own flags.
void resolve_program(std::vector<std::string> rest, const RawLaunchArgs& raw, LaunchConfig& c) {
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  TDIST_CHECK_ARG(!rest.empty(),
                  "tdistrun: no program given (usage: tdistrun [options] "
                  "PROGRAM [ARGS...])");
  TDIST_CHECK_ARG(!rest.front().empty(),
                  "tdistrun: the program to run is an empty string (an unset variable in the "
                  "job script?); give the executable's path");
  TDIST_CHECK_ARG(rest.front()[0] != '-',
                  "tdistrun: unknown option '" + rest.front() + "' (see --help)");
  TDIST_CHECK_ARG(!raw.module, "tdistrun: -m/--module is not supported; give an executable");
  c.program = rest.front();
  c.args.assign(rest.begin() + 1, rest.end());
}

// Nodes, workers, restarts, timings, streams and the launcher.
void resolve_workers(const RawLaunchArgs& raw, LaunchConfig& c) {
  c.nproc_per_node = resolve_nproc(raw.nproc);
  if (auto colon = raw.nnodes.find(':'); colon != std::string::npos) {
    c.min_nodes = parse_int(raw.nnodes.substr(0, colon), "--nnodes MIN");
    c.max_nodes = parse_int(raw.nnodes.substr(colon + 1), "--nnodes MAX");
  } else {
    c.min_nodes = c.max_nodes = parse_int(raw.nnodes, "--nnodes");
  }
  TDIST_CHECK_ARG(c.min_nodes >= 1 && c.min_nodes <= c.max_nodes,
                  "tdistrun: --nnodes needs 1 <= MIN <= MAX, got '" + raw.nnodes + "'");
  TDIST_CHECK_ARG(c.max_restarts >= 0, "tdistrun: --max-restarts must be >= 0");
  c.monitor_interval = std::max(std::chrono::milliseconds(1),
                                seconds_to_ms(raw.monitor_interval, "--monitor-interval"));
  c.stop_timeout = seconds_to_ms(raw.stop_timeout, "--stop-timeout");
  c.master_port_given = raw.master_port->count() > 0;
  TDIST_CHECK_ARG(c.master_port >= 0 && c.master_port < 65536,
                  "tdistrun: --master-port out of range");
  c.redirects = StreamSelection::parse(raw.redirects, "--redirects");
  c.tee = StreamSelection::parse(raw.tee, "--tee");
  if (!raw.ranks_filter.empty()) {
    for (const auto& r : split(raw.ranks_filter, ',')) {
      c.local_ranks_filter.insert(parse_int(r, "--local-ranks-filter"));
    }
  }
  c.store_secret = !raw.no_secret;
  TDIST_CHECK_ARG(c.launcher == "fork" || c.launcher == "mpirun",
                  "tdistrun: --launcher must be fork or mpirun, got '" + c.launcher + "'");
  for (const auto& a : split(raw.mpirun_args, ' ')) {
    if (!a.empty()) c.mpirun_args.push_back(a);
  }
  TDIST_CHECK_ARG(c.mpirun_args.empty() || c.launcher == "mpirun",
                  "tdistrun: --mpirun-args needs --launcher mpirun");
  if (!raw.numa_binding.empty()) c.numa_binding = parse_numa_binding(raw.numa_binding);
  // mpirun forks those workers itself, so tdistrun has no child in which to bind them.
  TDIST_CHECK_ARG(c.numa_binding == NumaBinding::kNone || c.launcher == "fork",
                  "tdistrun: --numa-binding needs --launcher fork (mpirun starts its workers "
                  "itself, with --bind-to none)");
}

// --rdzv-conf key=value,...: the timeouts and keep-alive settings tdistrun uses (torchelastic's
// names); torchrun's other keys (read_timeout, is_host...) are accepted and ignored.
void apply_rdzv_conf(const std::string& rdzv_conf, LaunchConfig& c) {
  for (const auto& item : split(rdzv_conf, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    TDIST_CHECK_ARG(eq != std::string::npos,
                    "tdistrun: --rdzv-conf expects key=value pairs, got '" + item + "'");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    double seconds = 0;
    try {
      seconds = std::stod(value);
    } catch (const std::exception&) {
      TDIST_THROW(InvalidArgument, "tdistrun: --rdzv-conf " + key + " must be seconds");
    }
    if (key == "join_timeout" || key == "timeout") {
      c.join_timeout = seconds_to_ms(seconds, key);
    } else if (key == "last_call_timeout") {
      c.last_call_timeout = seconds_to_ms(seconds, key);
    } else if (key == "close_timeout" || key == "exit_barrier_timeout") {
      c.exit_barrier_timeout = seconds_to_ms(seconds, key);
    } else if (key == "keep_alive_interval") {
      c.keep_alive_interval = seconds_to_ms(seconds, key);
      TDIST_CHECK_ARG(c.keep_alive_interval.count() > 0,
                      "tdistrun: --rdzv-conf keep_alive_interval must be positive, got " + value);
    } else if (key == "keep_alive_max_attempt") {
      TDIST_CHECK_ARG(seconds >= 1 && seconds == static_cast<int>(seconds),
                      "tdistrun: --rdzv-conf keep_alive_max_attempt must be a whole number >= 1, "
                      "got " +
                          value);
      c.keep_alive_max_attempt = static_cast<int>(seconds);
    }
  }
}

// The rendezvous: standalone, static (fixed node ranks) or c10d (ranks by join order), and
// where its store is.
void resolve_rendezvous(const RawLaunchArgs& raw, LaunchConfig& c) {
  std::string rdzv_endpoint = raw.rdzv_endpoint;
  if (c.standalone) {
    TDIST_CHECK_ARG(c.max_nodes == 1,
                    "tdistrun: --standalone runs a single node; drop "
                    "--nnodes " +
                        raw.nnodes + " or --standalone");
    if (c.rdzv_id == "none") c.rdzv_id = "standalone-" + std::to_string(getpid());
  }
  c.rdzv_backend =
      raw.rdzv_backend.empty() ? (rdzv_endpoint.empty() ? "static" : "c10d") : raw.rdzv_backend;
  TDIST_CHECK_ARG(c.rdzv_backend == "static" || c.rdzv_backend == "c10d" || c.rdzv_backend == "tcp",
                  "tdistrun: --rdzv-backend must be static or c10d, got '" + c.rdzv_backend + "'");
  if (c.rdzv_backend == "tcp") c.rdzv_backend = "c10d";
  if (c.rdzv_backend == "static") {
    if (rdzv_endpoint.empty()) {
      c.rdzv_host = c.master_addr;
      c.rdzv_port = c.master_port;
    } else {
      parse_endpoint(rdzv_endpoint, c.master_port, &c.rdzv_host, &c.rdzv_port);
    }
    TDIST_CHECK_ARG(c.max_nodes == 1 || !c.is_elastic(),
                    "tdistrun: --nnodes MIN:MAX needs --rdzv-backend c10d and "
                    "--rdzv-endpoint (static rendezvous has a fixed node count)");
    TDIST_CHECK_ARG(c.node_rank >= 0 && c.node_rank < c.max_nodes,
                    "tdistrun: --node-rank " + std::to_string(c.node_rank) + " is outside [0, " +
                        std::to_string(c.max_nodes) + ")");
  } else {
    if (rdzv_endpoint.empty()) rdzv_endpoint = c.master_addr;
    parse_endpoint(rdzv_endpoint, 29400, &c.rdzv_host, &c.rdzv_port);
  }
  TDIST_CHECK_ARG(c.launcher != "mpirun" || c.max_nodes == 1,
                  "tdistrun: --launcher mpirun runs a single node (--nnodes 1); for several "
                  "nodes start the job with mpirun itself (mpirun -n TOTAL --host ... "
                  "PROGRAM: rank and world size then come from MPI)");
  if (c.max_nodes > 1) {
    TDIST_CHECK_ARG(c.rdzv_port > 0,
                    "tdistrun: a multi-node job needs a fixed rendezvous "
                    "port (not 0) that every node can reach");
  }
}

}  // namespace

ParsedArgs parse_launch_args(int argc, const char* const* argv) {
  CLI::App app{
      "tdistrun [OPTIONS] PROGRAM [ARGS...]: start the processes of a distributed "
      "tdist job (torchrun's flags)",
      "tdistrun"};
  app.prefix_command();
  app.footer(kFooter);
  app.get_formatter()->column_width(34);
  RawLaunchArgs raw;
  LaunchConfig c;
  add_launch_options(app, raw, c);

  ParsedArgs result;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    result.message = app.help();
    return result;
  } catch (const CLI::ParseError& e) {
    result.exit_code = 2;
    result.message = std::string("tdistrun: ") + e.what() + "\nRun with --help for usage.\n";
    return result;
  }
  try {
    resolve_program(app.remaining(), raw, c);
    resolve_workers(raw, c);
    apply_rdzv_conf(raw.rdzv_conf, c);
    resolve_rendezvous(raw, c);
  } catch (const std::exception& e) {
    result.exit_code = 2;
    result.message = std::string(e.what()) + "\n";
    return result;
  }
  result.config = std::move(c);
  return result;
}

}  // namespace tdist::launch

#include "tdist/launch/elastic_agent.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>

#include "launch/failure_cause.h"
#include "launch/mpirun_launch.h"
#include "launch/process_util.h"
#include "tdist/detail/util/openblas_core.h"

extern char** environ;

namespace tdist::launch {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {
constexpr const char* kSysfsRoot = "/sys";

void note(const std::string& message) {
  std::string line = "tdistrun: " + message + "\n";
  write_all(2, line.data(), line.size());
}

// Keeps forwarding output for a moment, so that a worker that just exited has its last lines
// read before it is summarised.
void collect_last_words(WorkerGroup& group) {
  const auto until = Clock::now() + milliseconds(100);
  while (Clock::now() < until) group.pump(milliseconds(10));
}
}  // namespace

ElasticAgent::ElasticAgent(LaunchConfig config, Rendezvous& rendezvous)
    : config_(std::move(config)), rendezvous_(rendezvous) {
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) base_env_[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  choose_openblas_kernels();
  bind_to_numa_nodes();
  bool needs_files = config_.redirects.all || !config_.redirects.per_local_rank.empty() ||
                     config_.tee.all || !config_.tee.per_local_rank.empty();
  if (!config_.log_dir.empty()) {
    log_root_ = (std::filesystem::path(config_.log_dir) / config_.rdzv_id).string();
  } else if (needs_files) {
    // torchrun does the same: --redirects/--tee without --log-dir log to a temp dir.
    log_root_ = run_dir() + "/logs";
    note("no --log-dir given; worker logs go to " + log_root_);
  }
}

// Note [OpenBLAS on CPUs it does not know] (src/util/openblas_core.h).
void ElasticAgent::choose_openblas_kernels() {
  if (base_env_.count("OPENBLAS_CORETYPE")) return;
  const std::string core = tdist::detail::system_openblas_core();
  const char* fix = tdist::detail::openblas_coretype_fix(core);
  if (!fix) return;
  base_env_["OPENBLAS_CORETYPE"] = fix;
  note("OpenBLAS does not recognise this CPU and would run its generic " + core +
       " kernels; the workers get OPENBLAS_CORETYPE=" + fix +
       " (set OPENBLAS_CORETYPE to choose another)");
}

void ElasticAgent::bind_to_numa_nodes() {
  if (config_.numa_binding == NumaBinding::kNone) return;
  cpu_sets_ = numa_cpu_sets(config_.numa_binding, config_.nproc_per_node,
                            CpuTopology::read(kSysfsRoot), allowed_cpus());
  std::string where;
  for (size_t local = 0; local < cpu_sets_.size(); ++local) {
    where += (local ? ", " : "") + std::to_string(local) + ": " + format_cpu_list(cpu_sets_[local]);
  }
  note("--numa-binding " + numa_binding_name(config_.numa_binding) + ": CPUs per local rank {" +
       where + "}");
}

ElasticAgent::~ElasticAgent() {
  if (!run_dir_.empty()) {
    std::error_code ec;
    if (log_root_.rfind(run_dir_, 0) == 0) {
      std::filesystem::remove(secret_file_, ec);  // keep the logs, drop the secret
    } else {
      std::filesystem::remove_all(run_dir_, ec);
    }
  }
}

const std::string& ElasticAgent::run_dir() {
  if (run_dir_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string parent = tmp && *tmp ? tmp : "/tmp";
    detail::remove_stale_run_dirs(parent);
    std::string pattern = parent + "/" + detail::run_dir_prefix(getpid()) + "XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) {
      TDIST_THROW(Error, "tdistrun: cannot create a private directory " + pattern + ": " +
                             std::strerror(errno));
    }
    run_dir_ = buf.data();
  }
  return run_dir_;
}

void ElasticAgent::write_secret_file(const std::string& secret) {
  if (!secret_file_.empty()) return;
  std::string path = run_dir() + "/store_secret";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 || !write_all(fd, secret.data(), secret.size())) {
    TDIST_THROW(Error, "tdistrun: cannot write the store secret file " + path + ": " +
                           std::strerror(errno));
  }
  ::close(fd);
  secret_file_ = path;
}

std::vector<std::string> ElasticAgent::worker_env(const RendezvousInfo& info,
                                                  int local_rank) const {
  auto env = base_env_;
  int rank = info.rank_offset + local_rank;
  auto set = [&](const char* key, const std::string& value) { env[key] = value; };
  set("RANK", std::to_string(rank));
  set("LOCAL_RANK", std::to_string(local_rank));
  set("WORLD_SIZE", std::to_string(info.world_size));
  set("LOCAL_WORLD_SIZE", std::to_string(info.local_world_size));
  set("GROUP_RANK", std::to_string(info.group_rank));
  set("GROUP_WORLD_SIZE", std::to_string(info.group_world_size));
  set("ROLE_RANK", std::to_string(rank));
  set("ROLE_WORLD_SIZE", std::to_string(info.world_size));
  set("ROLE_NAME", config_.role);
  set("MASTER_ADDR", info.master_addr);
  set("MASTER_PORT", std::to_string(info.master_port));
  set("TORCHELASTIC_RUN_ID", config_.rdzv_id);
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(info.restart_count));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(config_.max_restarts));
  // Counts every restart, membership changes too: a worker that resumes only when restarted
  // after a failure would start afresh after a node joined (and a trainer that clears its
  // run directory on a fresh start would lose the job's checkpoints).
  set("TDIST_ELASTIC_ROUND", std::to_string(info.round));
  // Workers create their own store (rank 0 hosts it at MASTER_PORT), not the agent's.
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  if (!secret_file_.empty()) set("TDIST_STORE_SECRET_FILE", secret_file_);
  // A rank that times out dumps its flight recorder beside its logs.
  if (!log_root_.empty() && !env.count("TDIST_FLIGHT_RECORDER_DIR")) {
    set("TDIST_FLIGHT_RECORDER_DIR",
        (std::filesystem::path(log_root_) / ("attempt_" + std::to_string(info.round))).string());
  }
  // As torchrun: several workers per node each get one OpenMP thread unless told otherwise.
  if (info.local_world_size > 1 && !env.count("OMP_NUM_THREADS")) set("OMP_NUM_THREADS", "1");
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::vector<WorkerSpec> ElasticAgent::worker_specs(const RendezvousInfo& info) const {
  std::vector<WorkerSpec> specs;
  for (int local = 0; local < info.local_world_size; ++local) {
    WorkerSpec spec;
    spec.local_rank = local;
    spec.rank = info.rank_offset + local;
    spec.env = worker_env(info, local);
    auto& out = spec.output;
    out.prefix = "[rank " + std::to_string(spec.rank) + "]: ";
    bool shown = config_.local_ranks_filter.empty() || config_.local_ranks_filter.count(local);
    auto console = [&](int stream) {
      return shown &&
             (!config_.redirects.selects(local, stream) || config_.tee.selects(local, stream));
    };
    out.console_stdout = console(StreamSelection::kStdout);
    out.console_stderr = console(StreamSelection::kStderr);
    if (!log_root_.empty()) {
      auto dir = std::filesystem::path(log_root_) / ("attempt_" + std::to_string(info.round)) /
                 ("rank_" + std::to_string(spec.rank));
      out.stdout_path = (dir / "stdout.log").string();
      out.stderr_path = (dir / "stderr.log").string();
    }
    out.tail_lines = static_cast<size_t>(std::max(0, config_.summary_lines));
    if (!cpu_sets_.empty()) spec.cpus = cpu_sets_[local];
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::string ElasticAgent::describe_failure(const RendezvousInfo& info,
                                           const WorkerStatus& failed) const {
  std::string text = "first failure: rank " + std::to_string(failed.rank) + " (local rank " +
                     std::to_string(failed.local_rank) + " on node " +
                     std::to_string(info.group_rank) + ", host " + detail::host_name() + ", pid " +
                     std::to_string(failed.pid) + ", attempt " + std::to_string(info.round) + ") " +
                     failed.describe();
  if (failed.tail.empty()) return text + "; it printed nothing";
  text += "; its last output lines:";
  for (const auto& line : failed.tail)
    text += "\n  [rank " + std::to_string(failed.rank) + "]: " + line;
  return text;
}

// Note [Blaming the lost peer] (failure_cause.h): a failed worker that only lost its
// connection to rank N is not the cause while N is still on its way out. Waits up to
// kCauseWait for a local N to exit (then N is the cause, and its own words are read in
// turn), or for a remote N's node to report first (its report wins the rendezvous).
const WorkerStatus& ElasticAgent::find_cause(WorkerGroup& group, const RendezvousInfo& info) {
  const auto& statuses = group.statuses();
  const WorkerStatus* cause = group.first_failure();
  std::set<int> blamed = {cause->rank};
  const auto deadline = Clock::now() + kCauseWait;
  auto reported_elsewhere = [&] {
    try {
      return rendezvous_.failure_reported(info.round);
    } catch (const std::exception&) {
      return true;  // the store is gone: no report is coming
    }
  };
  while (auto peer = detail::lost_peer_named_in(cause->tail)) {
    if (!blamed.insert(*peer).second) break;  // ranks that lost each other: keep the first
    const int local = *peer - info.rank_offset;
    const bool on_this_node = local >= 0 && local < static_cast<int>(statuses.size());
    while (Clock::now() < deadline) {
      if (on_this_node && statuses[local].state != WorkerStatus::State::kRunning) break;
      if (!on_this_node && reported_elsewhere()) break;
      group.pump(milliseconds(10));
    }
    if (!on_this_node || statuses[local].state != WorkerStatus::State::kFailed) break;
    cause = &statuses[local];
    collect_last_words(group);  // for the summary and the next link
  }
  return *cause;
}

ElasticAgent::Outcome ElasticAgent::run_round(const RendezvousInfo& info,
                                              const std::string& program) {
  auto& signals = detail::SignalPipe::instance();
  auto force = [&] { return signals.drain() != 0; };
  // --launcher mpirun: the group is one mpirun that starts the workers (Note [Workers
  // through mpirun] in mpirun_launch.h); its attempt directory holds their specs.
  std::string mpirun_dir;
  std::unique_ptr<WorkerGroup> workers;
  if (config_.launcher == "mpirun") {
    mpirun_dir = run_dir() + "/mpirun_attempt_" + std::to_string(info.round);
    auto plan =
        detail::plan_mpirun(config_, worker_specs(info), program, mpirun_dir, worker_env(info, 0));
    workers = std::make_unique<WorkerGroup>(plan.program, plan.args);
    workers->start({plan.spec});
  } else {
    workers = std::make_unique<WorkerGroup>(program, config_.args);
    workers->start(worker_specs(info));
  }
  WorkerGroup& group = *workers;
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ec;
      if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
  } remove_mpirun_dir{mpirun_dir};
  bool reported_success = false;
  auto last_check = Clock::now();
  while (true) {
    group.pump(config_.monitor_interval, signals.fd());
    if (int s = signals.drain()) {
      signal_ = s;
      note("got " + detail::signal_name(s) + ", forwarding it to the workers");
      try {
        rendezvous_.abort("node " + std::to_string(info.group_rank) + " (" + detail::host_name() +
                          ") got " + detail::signal_name(s));
      } catch (const std::exception&) {
      }
      group.stop(s, config_.stop_timeout, force);
      return Outcome::kInterrupted;
    }
    if (group.first_failure() != nullptr) {
      collect_last_words(group);
      std::string summary;
      if (mpirun_dir.empty()) {
        summary = describe_failure(info, find_cause(group, info));
      } else if (auto recorded = detail::first_recorded_failure(mpirun_dir)) {
        summary = describe_failure(info, *recorded);
      } else {
        // mpirun failed before any worker did (bad arguments, a worker it could not start).
        WorkerStatus failed = *group.first_failure();
        summary = "first failure: mpirun (pid " + std::to_string(failed.pid) + ", node " +
                  std::to_string(info.group_rank) + ", host " + detail::host_name() + ", attempt " +
                  std::to_string(info.round) + ") " + failed.describe();
        if (!failed.tail.empty()) summary += "; its last output lines:";
        for (const auto& line : failed.tail) summary += "\n  [mpirun]: " + line;
      }
      try {
        rendezvous_.report_failure(info.round, summary);
      } catch (const std::exception& e) {
        note(std::string("could not tell the other nodes about the failure: ") + e.what());
      }
      group.stop(SIGTERM, config_.stop_timeout, force);
      return Outcome::kEnded;
    }
    if (!reported_success && group.all_exited() && group.all_succeeded()) {
      group.finish();
      rendezvous_.report_success(info.round);
      reported_success = true;
    }
    auto now = Clock::now();
    if (now - last_check >= config_.monitor_interval || reported_success) {
      last_check = now;
      if (auto outcome = check_round(group, info, reported_success, force)) return *outcome;
    }
  }
}

std::optional<ElasticAgent::Outcome> ElasticAgent::check_round(WorkerGroup& group,
                                                               const RendezvousInfo& info,
                                                               bool reported_success,
                                                               const std::function<bool()>& force) {
  KeepAliveProblem problem = rendezvous_.keep_alive(info);
  if (!problem.empty()) return end_for_silence(group, info, problem, force);
  try {
    if (rendezvous_.failure_reported(info.round)) {
      group.stop(SIGTERM, config_.stop_timeout, force);
      return Outcome::kEnded;
    }
    // Only a node whose workers still run may end the round: a round in which every node
    // reported success is over, and nobody may restart it behind the others' back.
    if (!reported_success && node_waiting_with_room(info)) {
      rendezvous_.request_rejoin(info.round, "a node is waiting to join");
      group.stop(SIGTERM, config_.stop_timeout, force);
      return Outcome::kEnded;
    }
    if (reported_success && rendezvous_.all_succeeded(info.round)) return Outcome::kSucceeded;
  } catch (const TimeoutError& e) {
    return end_for_silence(group, info, rendezvous_.lost_store(e.what()), force);
  }
  return std::nullopt;
}

ElasticAgent::Outcome ElasticAgent::end_for_silence(WorkerGroup& group, const RendezvousInfo& info,
                                                    const KeepAliveProblem& problem,
                                                    const std::function<bool()>& force) {
  note(problem.what);
  if (!problem.store_lost) {
    try {
      rendezvous_.report_failure(info.round, "first failure: " + problem.what);
    } catch (const std::exception& e) {
      note(std::string("could not tell the other nodes: ") + e.what());
    }
  }
  group.stop(SIGTERM, config_.stop_timeout, force);
  return problem.store_lost ? Outcome::kStoreLost : Outcome::kEnded;
}

bool ElasticAgent::node_waiting_with_room(const RendezvousInfo& info) {
  if (info.group_world_size >= config_.max_nodes) return false;
  try {
    return rendezvous_.nodes_waiting(info.round) > 0;
  } catch (const std::exception&) {
    return false;  // the store is gone: the failure path reports it
  }
}

void ElasticAgent::leave(bool quick) {
  try {
    rendezvous_.shutdown(quick);
  } catch (const std::exception& e) {
    note(std::string("could not say goodbye to the rendezvous store: ") + e.what());
  }
}

int ElasticAgent::run() {
  auto& signals = detail::SignalPipe::instance();
  rendezvous_.set_interrupt_check([&] {
    if (int s = signals.drain()) signal_ = s;
    return signal_ != 0;
  });
  std::string program = detail::resolve_program(config_.program);
  int restarts = 0;
  bool membership_changed = false;
  for (int round = 0;; ++round) {
    RendezvousInfo info;
    try {
      info = rendezvous_.join(round, restarts);
    } catch (const Interrupted& e) {
      note(e.what());
      if (signal_ != 0) {
        try {
          rendezvous_.abort(std::string("a launcher got ") + detail::signal_name(signal_));
        } catch (const std::exception&) {
        }
      }
      leave(true);
      return signal_ != 0 ? 128 + signal_ : 1;
    }
    round = info.round;  // later than asked when this node joined a running job
    restarts = info.restart_count;
    if (membership_changed) {
      note("node joined; restarting the workers at " + std::to_string(info.group_world_size) +
           " nodes (not counted against --max-restarts)");
      membership_changed = false;
    }
    if (!info.store_secret.empty()) write_secret_file(info.store_secret);
    Outcome outcome = run_round(info, program);
    if (outcome == Outcome::kSucceeded) {
      leave(false);
      return 0;
    }
    if (outcome == Outcome::kInterrupted) {
      leave(true);
      return 128 + signal_;
    }
    if (outcome == Outcome::kStoreLost) {
      note("job failed: no restart can meet without the rendezvous store");
      return 1;
    }
    std::string aborted = rendezvous_.aborted();
    if (!aborted.empty()) {
      note("stopped because " + aborted);
      leave(true);
      return 1;
    }
    if (rendezvous_.membership_changed(round)) {
      membership_changed = true;
      continue;
    }
    if (restarts < config_.max_restarts) {
      std::string failure = rendezvous_.failure(round);
      note("restarting the workers (restart " + std::to_string(restarts + 1) + " of " +
           std::to_string(config_.max_restarts) + ") after " +
           failure.substr(0, failure.find('\n')));
      ++restarts;
      continue;
    }
    note("job failed after " + std::to_string(restarts + 1) + " attempt(s) (--max-restarts " +
         std::to_string(config_.max_restarts) + ")\ntdistrun: " + rendezvous_.failure(round));
    leave(false);
    return 1;
  }
}

}  // namespace tdist::launch

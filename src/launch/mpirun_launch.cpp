#include "launch/mpirun_launch.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "launch/process_util.h"
#include "tdist/error.h"

extern char** environ;

namespace tdist::launch::detail {

namespace {

constexpr const char* kSpecMagic = "tdistrun-mpi-spec-1";
constexpr const char* kFailureMagic = "tdistrun-mpi-failure-1";

std::string spec_path(const std::string& dir, int local_rank) {
  return dir + "/spec_" + std::to_string(local_rank);
}

// Files of NUL-terminated fields, written whole (temp file + rename) with mode 0600.
void write_fields(const std::string& path, const std::vector<std::string>& fields) {
  std::string data;
  for (const auto& f : fields) {
    data += f;
    data.push_back('\0');
  }
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || !write_all(fd, data.data(), data.size())) {
    if (fd >= 0) ::close(fd);
    TDIST_THROW(Error, "tdistrun: cannot write " + tmp + ": " + std::strerror(errno));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    TDIST_THROW(Error, "tdistrun: cannot rename " + tmp + ": " + std::strerror(errno));
  }
}

std::optional<std::vector<std::string>> read_fields(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string data;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) data.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  std::vector<std::string> fields;
  size_t start = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == '\0') {
      fields.push_back(data.substr(start, i - start));
      start = i + 1;
    }
  }
  return fields;
}

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) TDIST_THROW(Error, "tdistrun: cannot read /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The shim's own MPI rank: the worker's local rank (one mpirun per node).
int mpi_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return -1;
}

void shim_error(const std::string& message) {
  std::string line = "tdistrun (mpi worker shim): " + message + "\n";
  write_all(2, line.data(), line.size());
}

}  // namespace

MpirunPlan plan_mpirun(const LaunchConfig& config, const std::vector<WorkerSpec>& workers,
                       const std::string& program, const std::string& dir,
                       std::vector<std::string> mpirun_env) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (::mkdir(dir.c_str(), 0700) != 0) {
    TDIST_THROW(Error, "tdistrun: cannot create " + dir + ": " + std::strerror(errno));
  }
  for (const auto& w : workers) {
    const auto& o = w.output;
    std::vector<std::string> fields = {kSpecMagic,
                                       std::to_string(w.local_rank),
                                       std::to_string(w.rank),
                                       o.prefix,
                                       o.console_stdout ? "1" : "0",
                                       o.console_stderr ? "1" : "0",
                                       o.stdout_path,
                                       o.stderr_path,
                                       std::to_string(o.tail_lines),
                                       std::to_string(config.stop_timeout.count())};
    fields.insert(fields.end(), w.env.begin(), w.env.end());
    write_fields(spec_path(dir, w.local_rank), fields);
  }

  MpirunPlan plan;
  plan.program = resolve_program(config.mpirun);
  plan.args = {"-n", std::to_string(workers.size()), "--oversubscribe", "--bind-to", "none"};
  // OpenMPI refuses to run as root unless told; tdistrun's forked workers have no such rule.
  if (::geteuid() == 0) plan.args.push_back("--allow-run-as-root");
  plan.args.insert(plan.args.end(), config.mpirun_args.begin(), config.mpirun_args.end());
  plan.args.push_back(self_exe());
  plan.args.push_back(kMpiWorkerShimFlag);
  plan.args.push_back(program);
  plan.args.insert(plan.args.end(), config.args.begin(), config.args.end());

  mpirun_env.push_back(std::string(kMpiSpecDirEnv) + "=" + dir);
  plan.spec.local_rank = 0;
  plan.spec.rank = workers.empty() ? 0 : workers.front().rank;
  plan.spec.env = std::move(mpirun_env);
  // The shims prefix, filter and log each rank's lines; mpirun's own lines pass as they are.
  plan.spec.output.prefix = "";
  plan.spec.output.tail_lines = static_cast<size_t>(std::max(0, config.summary_lines));
  return plan;
}

std::optional<WorkerStatus> first_recorded_failure(const std::string& dir) {
  std::optional<WorkerStatus> first;
  int64_t first_time = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("failure_", 0) != 0 || name.find(".tmp") != std::string::npos) continue;
    auto fields = read_fields(entry.path().string());
    if (!fields || fields->size() < 7 || (*fields)[0] != kFailureMagic) continue;
    try {
      const int64_t time = std::stoll((*fields)[1]);
      WorkerStatus status;
      status.local_rank = std::stoi((*fields)[2]);
      status.rank = std::stoi((*fields)[3]);
      status.pid = std::stoi((*fields)[4]);
      status.exit_code = std::stoi((*fields)[5]);
      status.signal = std::stoi((*fields)[6]);
      status.state = WorkerStatus::State::kFailed;
      status.tail.assign(fields->begin() + 7, fields->end());
      if (!first || time < first_time) {
        first = std::move(status);
        first_time = time;
      }
    } catch (const std::exception&) {
      // A malformed record is skipped; mpirun's own status is reported instead.
    }
  }
  return first;
}

int mpi_worker_shim_main(int argc, const char* const* argv) {
  if (argc < 1) {
    shim_error("no program given (this mode is internal to tdistrun --launcher mpirun)");
    return 2;
  }
  const char* dir = std::getenv(kMpiSpecDirEnv);
  const int local_rank = mpi_local_rank();
  if (dir == nullptr || local_rank < 0) {
    shim_error(std::string("not started by tdistrun --launcher mpirun (") +
               (dir ? "no OMPI_COMM_WORLD_RANK" : std::string("no ") + kMpiSpecDirEnv) + ")");
    return 2;
  }
  auto fields = read_fields(spec_path(dir, local_rank));
  if (!fields || fields->size() < 10 || (*fields)[0] != kSpecMagic) {
    shim_error("no valid spec for local rank " + std::to_string(local_rank) + " in " + dir +
               " (more mpirun ranks than --nproc-per-node?)");
    return 2;
  }
  WorkerSpec spec;
  std::chrono::milliseconds stop_timeout{0};
  try {
    spec.local_rank = std::stoi((*fields)[1]);
    spec.rank = std::stoi((*fields)[2]);
    spec.output.prefix = (*fields)[3];
    spec.output.console_stdout = (*fields)[4] == "1";
    spec.output.console_stderr = (*fields)[5] == "1";
    spec.output.stdout_path = (*fields)[6];
    spec.output.stderr_path = (*fields)[7];
    spec.output.tail_lines = std::stoul((*fields)[8]);
    stop_timeout = std::chrono::milliseconds(std::stoll((*fields)[9]));
  } catch (const std::exception& e) {
    shim_error(std::string("malformed spec: ") + e.what());
    return 2;
  }
  // The worker's environment: mpirun's (OMPI_*, PMIX_*: how MPI_Init finds the world) with
  // the torchrun contract of this rank on top.
  std::map<std::string, std::string> env;
  auto add = [&env](const std::string& entry) {
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  };
  for (char** e = environ; e && *e; ++e) add(*e);
  for (size_t i = 10; i < fields->size(); ++i) {
    // What mpirun set for this process wins over what tdistrun's own environment had.
    const std::string& entry = (*fields)[i];
    bool mpi_owned = false;
    for (const char* prefix : {"OMPI_", "PMIX_", "PMI_"}) {
      mpi_owned = mpi_owned || entry.rfind(prefix, 0) == 0;
    }
    if (!mpi_owned) add(entry);
  }
  env.erase(kMpiSpecDirEnv);
  for (const auto& [k, v] : env) spec.env.push_back(k + "=" + v);

  auto& signals = SignalPipe::instance();
  // If mpirun dies (e.g. tdistrun was SIGKILLed and took it along), stop the worker too.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  int exit_code = 0;
  try {
    WorkerGroup group(argv[0], std::vector<std::string>(argv + 1, argv + argc));
    group.start({spec});
    while (!group.all_exited()) {
      group.pump(std::chrono::milliseconds(100), signals.fd());
      if (int s = signals.drain()) {
        // mpirun ends the job (another rank failed, or tdistrun stopped it): pass it on.
        group.stop(s, stop_timeout);
        return 128 + s;
      }
    }
    const int64_t exited_at = monotonic_ns();
    group.finish();
    const WorkerStatus& status = group.statuses().front();
    if (status.state == WorkerStatus::State::kSucceeded) return 0;
    std::vector<std::string> record = {kFailureMagic,
                                       std::to_string(exited_at),
                                       std::to_string(status.local_rank),
                                       std::to_string(status.rank),
                                       std::to_string(status.pid),
                                       std::to_string(status.exit_code),
                                       std::to_string(status.signal)};
    record.insert(record.end(), status.tail.begin(), status.tail.end());
    write_fields(std::string(dir) + "/failure_" + std::to_string(local_rank), record);
    exit_code = status.signal != 0 ? 128 + status.signal : status.exit_code;
  } catch (const std::exception& e) {
    shim_error(std::string("rank ") + std::to_string(spec.rank) + ": " + e.what());
    return 1;
  }
  return exit_code == 0 ? 1 : exit_code;
}

}  // namespace tdist::launch::detail

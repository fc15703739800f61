#include "tdist/launch/worker_group.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "launch/process_util.h"
#include "tdist/error.h"

namespace tdist::launch {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// A worker's CPU set, allocated before fork so the child only makes the syscall.
class CpuMask {
 public:
  explicit CpuMask(const std::set<int>& cpus) {
    if (cpus.empty()) return;
    const int count = *cpus.rbegin() + 1;
    mask_ = CPU_ALLOC(count);
    bytes_ = CPU_ALLOC_SIZE(count);
    CPU_ZERO_S(bytes_, mask_);
    for (int cpu : cpus) CPU_SET_S(cpu, bytes_, mask_);
  }
  ~CpuMask() {
    if (mask_) CPU_FREE(mask_);
  }
  CpuMask(const CpuMask&) = delete;
  CpuMask& operator=(const CpuMask&) = delete;

  /// In the child: binds it, or reports and exits (a worker on the wrong CPUs would be
  /// a silent slowdown).
  void apply_or_exit() const {
    if (!mask_ || sched_setaffinity(0, bytes_, mask_) == 0) return;
    static const char kMsg[] =
        "tdistrun: sched_setaffinity failed for the worker "
        "(--numa-binding)\n";
    [[maybe_unused]] ssize_t n = write(2, kMsg, sizeof(kMsg) - 1);
    _exit(127);
  }

 private:
  cpu_set_t* mask_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

struct WorkerGroup::Worker {
  pid_t pid = -1;
  int fds[2] = {-1, -1};  // read ends of the stdout and stderr pipes
  std::unique_ptr<WorkerOutput> output;
  bool closed = false;
};

std::string WorkerStatus::describe() const {
  if (signal != 0) {
    return "was killed by signal " + std::to_string(signal) + " (" + detail::signal_name(signal) +
           ")";
  }
  if (state == State::kRunning) return "is still running";
  return "exited with code " + std::to_string(exit_code);
}

WorkerGroup::WorkerGroup(std::string program, std::vector<std::string> args)
    : program_(std::move(program)), args_(std::move(args)) {}

WorkerGroup::~WorkerGroup() {
  bool open =
      std::any_of(workers_.begin(), workers_.end(), [](const auto& w) { return !w->closed; });
  if (open) stop(SIGKILL, milliseconds(0));
}

void WorkerGroup::start(const std::vector<WorkerSpec>& specs) {
  // Orphaned descendants of the workers are re-parented to us, so we can kill them.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  workers_.clear();
  statuses_.clear();
  first_failure_ = -1;
  stopping_ = false;

  // Everything the child needs is built before fork: the launcher may have threads (the
  // store server), so the child only calls async-signal-safe functions.
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program_.c_str()));
  for (auto& a : args_) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  for (const auto& spec : specs) {
    auto worker = std::make_unique<Worker>();
    worker->output = std::make_unique<WorkerOutput>(spec.output);
    std::vector<char*> envp;
    for (auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const CpuMask cpus(spec.cpus);

    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      TDIST_THROW(Error, std::string("tdistrun: pipe2 failed: ") + std::strerror(errno));
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
      TDIST_THROW(Error, "tdistrun: fork failed for rank " + std::to_string(spec.rank) + ": " +
                             std::strerror(errno));
    }
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // the launcher died before prctl
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGPIPE}) signal(s, SIG_DFL);
      dup2(out[1], 1);
      dup2(err[1], 2);
      cpus.apply_or_exit();
      if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0) {
        for (int fd = 3; fd < 1024; ++fd) close(fd);
      }
      execve(argv[0], argv.data(), envp.data());
      static const char kMsg[] = "tdistrun: execve failed for the worker program\n";
      [[maybe_unused]] ssize_t n = write(2, kMsg, sizeof(kMsg) - 1);
      _exit(127);
    }
    setpgid(pid, pid);  // also in the parent, so killpg works before the child runs
    close(out[1]);
    close(err[1]);
    worker->pid = pid;
    worker->fds[0] = out[0];
    worker->fds[1] = err[0];
    for (int fd : worker->fds) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);

    WorkerStatus status;
    status.local_rank = spec.local_rank;
    status.rank = spec.rank;
    status.pid = pid;
    statuses_.push_back(status);
    workers_.push_back(std::move(worker));
  }
}

void WorkerGroup::pump(milliseconds timeout, int wake_fd) {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, int>> owners;  // (worker, stream index)
  if (wake_fd >= 0) fds.push_back({wake_fd, POLLIN, 0});
  for (size_t i = 0; i < workers_.size(); ++i) {
    for (int s = 0; s < 2; ++s) {
      if (workers_[i]->fds[s] >= 0) {
        fds.push_back({workers_[i]->fds[s], POLLIN, 0});
        owners.emplace_back(i, s);
      }
    }
  }
  int ready = ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  if (ready > 0) {
    size_t base = wake_fd >= 0 ? 1 : 0;
    char buf[65536];
    for (size_t k = 0; k < owners.size(); ++k) {
      if ((fds[base + k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      auto [i, s] = owners[k];
      Worker& w = *workers_[i];
      ssize_t n = ::read(w.fds[s], buf, sizeof(buf));
      if (n > 0) {
        w.output->feed(s + 1, buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        ::close(w.fds[s]);
        w.fds[s] = -1;
      }
    }
  }
  reap();
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (statuses_[i].state != WorkerStatus::State::kRunning && !workers_[i]->closed) {
      statuses_[i].tail = workers_[i]->output->tail();
    }
  }
}

void WorkerGroup::reap() {
  int wstatus = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &wstatus, WNOHANG)) > 0) {
    for (size_t i = 0; i < statuses_.size(); ++i) {
      WorkerStatus& st = statuses_[i];
      if (st.pid != pid || st.state != WorkerStatus::State::kRunning) continue;
      if (WIFEXITED(wstatus)) st.exit_code = WEXITSTATUS(wstatus);
      if (WIFSIGNALED(wstatus)) st.signal = WTERMSIG(wstatus);
      if (st.exit_code == 0 && st.signal == 0) {
        st.state = WorkerStatus::State::kSucceeded;
      } else if (stopping_) {
        st.state = WorkerStatus::State::kStopped;
      } else {
        st.state = WorkerStatus::State::kFailed;
        if (first_failure_ < 0) first_failure_ = static_cast<int>(i);
      }
    }
    // Anything else is an adopted descendant of a worker: reaped, nothing to record.
  }
}

bool WorkerGroup::all_exited() const {
  return std::all_of(statuses_.begin(), statuses_.end(), [](const WorkerStatus& s) {
    return s.state != WorkerStatus::State::kRunning;
  });
}

bool WorkerGroup::all_succeeded() const {
  return std::all_of(statuses_.begin(), statuses_.end(), [](const WorkerStatus& s) {
    return s.state == WorkerStatus::State::kSucceeded;
  });
}

const WorkerStatus* WorkerGroup::first_failure() const {
  return first_failure_ < 0 ? nullptr : &statuses_[first_failure_];
}

void WorkerGroup::drain(milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  auto open = [&] {
    return std::any_of(workers_.begin(), workers_.end(),
                       [](const auto& w) { return w->fds[0] >= 0 || w->fds[1] >= 0; });
  };
  while (open() && Clock::now() < deadline) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    pump(std::clamp(left, milliseconds(0), milliseconds(20)));
  }
}

void WorkerGroup::close_output(size_t i) {
  Worker& w = *workers_[i];
  if (w.closed) return;
  for (int& fd : w.fds) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  w.output->finish();
  statuses_[i].tail = w.output->tail();
  w.closed = true;
}

void WorkerGroup::finish() {
  // Wait briefly for the pipes to reach EOF (a worker's descendant may still hold them).
  drain(milliseconds(200));
  for (auto& w : workers_) ::killpg(w->pid, SIGKILL);
  drain(milliseconds(50));
  for (size_t i = 0; i < workers_.size(); ++i) close_output(i);
  detail::kill_adopted_children({});
}

void WorkerGroup::stop(int signal, milliseconds grace, const std::function<bool()>& force) {
  stopping_ = true;
  // The whole process group: the worker and whatever it started. A stopped worker (SIGSTOP,
  // the frozen rank heartbeats name) keeps `signal` pending until it runs again: SIGCONT lets
  // it act on it now instead of after the whole grace period.
  for (auto& w : workers_) {
    ::killpg(w->pid, signal);
    ::killpg(w->pid, SIGCONT);
  }
  auto deadline = Clock::now() + grace;
  while (!all_exited() && Clock::now() < deadline) {
    pump(milliseconds(20));
    if (force && force()) break;
  }
  for (auto& w : workers_) ::killpg(w->pid, SIGKILL);
  auto kill_deadline = Clock::now() + std::chrono::seconds(10);
  while (!all_exited() && Clock::now() < kill_deadline) pump(milliseconds(10));
  drain(milliseconds(100));
  for (size_t i = 0; i < workers_.size(); ++i) close_output(i);
  detail::kill_adopted_children({});
}

}  // namespace tdist::launch

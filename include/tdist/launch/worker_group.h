#pragma once

// The workers of one node for one attempt: started together, watched together, stopped
// together. Each worker is exec'd in its own process group with PR_SET_PDEATHSIG, so a
// stop (or the launcher's death) reaches the worker and everything it spawned.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tdist/launch/worker_output.h"

namespace tdist::launch {

struct WorkerSpec {
  int local_rank = 0;
  int rank = 0;
  /// Complete environment of the worker, "KEY=value".
  std::vector<std::string> env;
  WorkerOutputOptions output;
  /// CPUs the worker is bound to (sched_setaffinity before exec); empty: the launcher's own.
  std::set<int> cpus;
};

struct WorkerStatus {
  enum class State { kRunning, kSucceeded, kFailed, kStopped };
  int local_rank = -1;
  int rank = -1;
  pid_t pid = -1;
  State state = State::kRunning;
  int exit_code = -1;             // when it exited normally
  int signal = 0;                 // when a signal ended it
  std::vector<std::string> tail;  // last output lines (filled once its output is closed)

  /// "exited with code 3" or "was killed by signal 9 (SIGKILL)".
  std::string describe() const;
};

class WorkerGroup {
 public:
  /// program: a path for execve (see detail::resolve_program); argv[0] is `program`.
  WorkerGroup(std::string program, std::vector<std::string> args);
  /// Kills (SIGKILL) and reaps whatever is still running.
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  /// Starts one process per spec.
  void start(const std::vector<WorkerSpec>& specs);

  /// Forwards output and reaps exited workers; waits up to `timeout` for something to
  /// happen, returning early when `wake_fd` (if >= 0) becomes readable.
  void pump(std::chrono::milliseconds timeout, int wake_fd = -1);

  bool all_exited() const;
  bool all_succeeded() const;
  /// The first worker seen failing (non-zero exit or a signal it did not get from us).
  const WorkerStatus* first_failure() const;

  /// Sends `signal` to every worker's process group, waits up to `grace` (pumping output),
  /// then SIGKILLs what is left (including workers' descendants) and closes the output.
  /// Stops waiting and SIGKILLs at once when `force` (polled) returns true, e.g. on a
  /// second Ctrl-C.
  void stop(int signal, std::chrono::milliseconds grace, const std::function<bool()>& force = {});

  /// After every worker exited: drains the output, closes it and kills leftover
  /// descendants. stop() does this itself.
  void finish();

  const std::vector<WorkerStatus>& statuses() const { return statuses_; }

 private:
  struct Worker;
  void reap();
  void close_output(size_t i);
  void drain(std::chrono::milliseconds timeout);

  std::string program_;
  std::vector<std::string> args_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<WorkerStatus> statuses_;
  int first_failure_ = -1;
  bool stopping_ = false;
};

}  // namespace tdist::launch

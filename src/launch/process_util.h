#pragma once

// Process and network helpers for tdistrun (internal).

#include <sys/types.h>

#include <string>
#include <vector>

namespace tdist::launch::detail {

/// Self-pipe for SIGINT/SIGTERM/SIGHUP/SIGQUIT/SIGCHLD; SIGPIPE is ignored. Installed once.
class SignalPipe {
 public:
  static SignalPipe& instance();
  int fd() const { return read_fd_; }
  /// Reads every pending signal; returns the last terminating signal seen (0: none, i.e.
  /// only SIGCHLD).
  int drain();

 private:
  SignalPipe();
  int read_fd_ = -1;
};

/// The path execve() should run for `program` (searched on PATH when it has no '/');
/// throws InvalidArgument when it is missing or not executable.
std::string resolve_program(const std::string& program);

/// "SIGKILL" for 9, "signal 77" for unknown numbers.
std::string signal_name(int signal);

/// A TCP port that was free on `host` (bound with port 0, then released).
int free_port(const std::string& host);

/// True when `host` resolves to an address of one of this machine's interfaces.
bool is_local_host(const std::string& host);

/// `bytes` random bytes as lowercase hex (getrandom).
std::string random_hex(size_t bytes);

/// Kills (SIGKILL) and reaps every child of this process whose pid is not in `keep`
/// (workers' descendants adopted by the launcher as child subreaper).
void kill_adopted_children(const std::vector<pid_t>& keep);

/// "tdistrun-<pid namespace>-<pid>-": the name prefix of a launcher's private run dir.
std::string run_dir_prefix(pid_t pid);

/// Removes `parent`/tdistrun-<pid namespace>-<pid>-* directories (private run dirs holding a store
/// secret) of launchers that no longer run, e.g. ones that were SIGKILLed.
void remove_stale_run_dirs(const std::string& parent);

/// This machine's host name.
std::string host_name();

}  // namespace tdist::launch::detail

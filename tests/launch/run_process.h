#pragma once

// Spawning tdistrun (and friends) from the launcher's tests.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace tdist::launch::testing {

struct ProcResult {
  int exit_code = -1;  // -1 when a signal ended it
  int signal = 0;
  bool timed_out = false;
  std::string out;
  std::string err;
};

/// A finished process for a failure message: exit code, signal, whether it timed out, output.
inline std::string describe(const ProcResult& r) {
  return "exit " + std::to_string(r.exit_code) + " signal " + std::to_string(r.signal) +
         (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

/// A child process whose stdout/stderr go to files (read back by wait()).
class Proc {
 public:
  Proc(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
  ~Proc();
  pid_t pid() const { return pid_; }
  void kill(int signal) const;
  /// Waits up to timeout (then SIGKILLs it and sets timed_out).
  ProcResult wait(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  /// Current stdout so far.
  std::string out_so_far() const;
  /// Current stderr so far.
  std::string err_so_far() const;

 private:
  pid_t pid_ = -1;
  std::string dir_;
  bool waited_ = false;
};

ProcResult run(const std::vector<std::string>& argv,
               const std::map<std::string, std::string>& env = {},
               std::chrono::milliseconds timeout = std::chrono::seconds(60));

/// tdistrun's path, the worker's path.
std::string tdistrun();
std::string worker();

/// A fresh empty directory, removed at exit.
std::string temp_dir();
std::string read_file(const std::string& path);
bool process_alive(pid_t pid);
/// Lines of `text` starting with `prefix`.
std::vector<std::string> lines_with(const std::string& text, const std::string& prefix);
/// The value of "ENV KEY=" in lines printed by `[rank N]: ` in out; "" if missing.
std::string env_of(const std::string& out, int rank, const std::string& key);
int free_tcp_port();

}  // namespace tdist::launch::testing

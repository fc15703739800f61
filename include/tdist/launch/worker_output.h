#pragma once

// Routing of one worker's stdout/stderr: whole lines to the launcher's console with a
// "[rank N]: " prefix (only whole lines per write, so lines never interleave), raw to
// per-rank log files, and the last lines kept for the failure summary.

#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tdist::launch {

/// Splits a byte stream into lines. A line longer than max_line is emitted in pieces.
class LineBuffer {
 public:
  using Emit = std::function<void(std::string_view line)>;
  explicit LineBuffer(size_t max_line = 64 * 1024) : max_line_(max_line) {}
  void append(const char* data, size_t size, const Emit& emit);
  /// Emits the unterminated rest, if any.
  void flush(const Emit& emit);

 private:
  std::string pending_;
  size_t max_line_;
};

struct WorkerOutputOptions {
  std::string prefix;  // e.g. "[rank 3]: "
  bool console_stdout = true;
  bool console_stderr = true;
  std::string stdout_path;  // empty: no log file
  std::string stderr_path;
  int console_stdout_fd = 1;
  int console_stderr_fd = 2;
  size_t tail_lines = 20;
};

class WorkerOutput {
 public:
  static constexpr int kStdout = 1;
  static constexpr int kStderr = 2;

  /// Opens (creating directories) the log files; throws tdist::Error naming the path.
  explicit WorkerOutput(WorkerOutputOptions options);
  ~WorkerOutput();
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  void feed(int stream, const char* data, size_t size);
  /// Flushes partial lines and closes the log files.
  void finish();
  /// Last lines of stderr, or of stdout when stderr was empty.
  std::vector<std::string> tail() const;

 private:
  void emit(int stream, std::string_view line);
  void flush(int stream);

  WorkerOutputOptions options_;
  LineBuffer buffers_[2];
  int files_[2] = {-1, -1};
  std::deque<std::string> tails_[2];
  std::string console_pending_[2];  // complete prefixed lines not yet written
  std::string file_pending_[2];
};

/// Writes all of data to fd (retrying on EINTR/partial writes); false on error.
bool write_all(int fd, const char* data, size_t size);

}  // namespace tdist::launch

#include "tdist/launch/worker_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tdist/error.h"

namespace tdist::launch {

bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        usleep(1000);  // a non-blocking console that is full: wait, never drop a line
        continue;
      }
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void LineBuffer::append(const char* data, size_t size, const Emit& emit) {
  pending_.append(data, size);
  size_t start = 0;
  while (true) {
    size_t newline = pending_.find('\n', start);
    if (newline == std::string::npos) break;
    std::string_view line = std::string_view(pending_).substr(start, newline - start);
    while (line.size() > max_line_) {
      emit(line.substr(0, max_line_));
      line.remove_prefix(max_line_);
    }
    emit(line);
    start = newline + 1;
  }
  pending_.erase(0, start);
  while (pending_.size() >= max_line_) {
    emit(std::string_view(pending_).substr(0, max_line_));
    pending_.erase(0, max_line_);
  }
}

void LineBuffer::flush(const Emit& emit) {
  if (!pending_.empty()) emit(pending_);
  pending_.clear();
}

WorkerOutput::WorkerOutput(WorkerOutputOptions options) : options_(std::move(options)) {
  const std::string* paths[2] = {&options_.stdout_path, &options_.stderr_path};
  for (int i = 0; i < 2; ++i) {
    if (paths[i]->empty()) continue;
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(*paths[i]).parent_path(), ec);
    files_[i] = ::open(paths[i]->c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (files_[i] < 0) {
      TDIST_THROW(Error, "tdistrun: cannot create log file " + *paths[i] + ": " +
                             std::strerror(errno) + " (check --log-dir)");
    }
  }
}

WorkerOutput::~WorkerOutput() {
  for (int& fd : files_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void WorkerOutput::feed(int stream, const char* data, size_t size) {
  buffers_[stream - 1].append(data, size, [&](std::string_view line) { emit(stream, line); });
  flush(stream);
}

void WorkerOutput::flush(int stream) {
  // All complete lines of one read go out in one write: whole lines only, so nothing
  // interleaves within a line, and one system call per chunk rather than per line.
  int i = stream - 1;
  if (!console_pending_[i].empty()) {
    write_all(stream == kStdout ? options_.console_stdout_fd : options_.console_stderr_fd,
              console_pending_[i].data(), console_pending_[i].size());
    console_pending_[i].clear();
  }
  if (!file_pending_[i].empty()) {
    if (files_[i] >= 0) write_all(files_[i], file_pending_[i].data(), file_pending_[i].size());
    file_pending_[i].clear();
  }
}

void WorkerOutput::finish() {
  for (int stream : {kStdout, kStderr}) {
    buffers_[stream - 1].flush([&](std::string_view line) { emit(stream, line); });
    flush(stream);
  }
  for (int& fd : files_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void WorkerOutput::emit(int stream, std::string_view line) {
  int i = stream - 1;
  bool console = stream == kStdout ? options_.console_stdout : options_.console_stderr;
  if (console) {
    console_pending_[i].append(options_.prefix).append(line).push_back('\n');
  }
  if (files_[i] >= 0) file_pending_[i].append(line).push_back('\n');
  if (options_.tail_lines > 0) {
    tails_[i].emplace_back(line);
    if (tails_[i].size() > options_.tail_lines) tails_[i].pop_front();
  }
}

std::vector<std::string> WorkerOutput::tail() const {
  const auto& chosen = tails_[1].empty() ? tails_[0] : tails_[1];
  return {chosen.begin(), chosen.end()};
}

}  // namespace tdist::launch

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "launch/run_process.h"
#include "tdist/launch/worker_output.h"

namespace tdist::launch {
namespace {

std::vector<std::string> split_all(LineBuffer& buffer, const std::vector<std::string>& chunks,
                                   bool flush) {
  std::vector<std::string> lines;
  auto emit = [&](std::string_view line) { lines.emplace_back(line); };
  for (const auto& c : chunks) buffer.append(c.data(), c.size(), emit);
  if (flush) buffer.flush(emit);
  return lines;
}

TEST(LineBuffer, JoinsChunksIntoLines) {
  LineBuffer buffer;
  auto lines = split_all(buffer, {"he", "llo\nwor", "ld\n\nlast"}, false);
  EXPECT_EQ(lines, (std::vector<std::string>{"hello", "world", ""}));
  auto rest = split_all(buffer, {}, true);
  EXPECT_EQ(rest, (std::vector<std::string>{"last"}));
}

TEST(LineBuffer, SplitsOverlongLines) {
  LineBuffer buffer(4);
  auto lines = split_all(buffer, {"abcdefghij\n"}, true);
  EXPECT_EQ(lines, (std::vector<std::string>{"abcd", "efgh", "ij"}));
}

TEST(WorkerOutput, PrefixesConsoleLinesAndWritesRawLogs) {
  std::string dir = testing::temp_dir();
  int console[2];
  ASSERT_EQ(pipe(console), 0);
  WorkerOutputOptions options;
  options.prefix = "[rank 7]: ";
  options.console_stdout_fd = console[1];
  options.console_stderr = false;  // like --redirects 2
  options.stdout_path = dir + "/a/stdout.log";
  options.stderr_path = dir + "/a/stderr.log";
  options.tail_lines = 2;
  WorkerOutput output(options);
  auto feed = [&](int stream, const std::string& text) {
    output.feed(stream, text.data(), text.size());
  };
  feed(WorkerOutput::kStdout, "one\ntw");
  feed(WorkerOutput::kStderr, "e1\ne2\ne3\n");
  feed(WorkerOutput::kStdout, "o\nunterminated");
  output.finish();
  close(console[1]);
  char buf[256] = {0};
  ssize_t n = read(console[0], buf, sizeof(buf) - 1);
  close(console[0]);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf), "[rank 7]: one\n[rank 7]: two\n[rank 7]: unterminated\n");
  EXPECT_EQ(testing::read_file(dir + "/a/stdout.log"), "one\ntwo\nunterminated\n");
  EXPECT_EQ(testing::read_file(dir + "/a/stderr.log"), "e1\ne2\ne3\n");
  EXPECT_EQ(output.tail(), (std::vector<std::string>{"e2", "e3"}));  // stderr preferred
}

TEST(WorkerOutput, UnwritableLogDirIsAClearError) {
  WorkerOutputOptions options;
  options.stdout_path = "/proc/no/such/dir/stdout.log";
  try {
    WorkerOutput output(options);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/no/such/dir/stdout.log"), std::string::npos);
  }
}

}  // namespace
}  // namespace tdist::launch

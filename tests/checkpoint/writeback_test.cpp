// Note [Writeback as written] (src/checkpoint/file_io.cpp): a durable file asks the kernel to
// start writing each finished window while later ones are produced; a file saved without
// fsync leaves the kernel to choose. sync_file_range is interposed here to see the requests.

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "checkpoint/file_io.h"
#include "helpers.h"
#include "tdist/checkpoint/checkpoint.h"

namespace writeback_test {

struct Request {
  std::string path;
  int64_t offset;
  int64_t bytes;
  unsigned flags;
};

std::mutex requests_mutex;
std::vector<Request> requests;

std::vector<Request> requests_for(const std::string& path) {
  std::lock_guard<std::mutex> lock(requests_mutex);
  std::vector<Request> mine;
  for (const auto& r : requests)
    if (r.path == path) mine.push_back(r);
  return mine;
}

/// Requests for files anywhere under `dir`.
size_t requests_under(const std::string& dir) {
  std::lock_guard<std::mutex> lock(requests_mutex);
  size_t n = 0;
  for (const auto& r : requests) n += r.path.rfind(dir + "/", 0) == 0;
  return n;
}

std::string fd_path(int fd) {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
  return ec ? std::string() : p.string();
}

}  // namespace writeback_test

// Every call of the process lands here first and goes on to libc's.
extern "C" int sync_file_range(int fd, off64_t offset, off64_t nbytes, unsigned int flags) {
  using Real = int (*)(int, off64_t, off64_t, unsigned int);
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "sync_file_range"));
  {
    std::lock_guard<std::mutex> lock(writeback_test::requests_mutex);
    writeback_test::requests.push_back({writeback_test::fd_path(fd), offset, nbytes, flags});
  }
  return real(fd, offset, nbytes, flags);
}

namespace writeback_test {
namespace {

namespace fs = std::filesystem;
using tdist::checkpoint::detail::OutputFile;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("tdist-writeback-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_all(const fs::path& path) {
  return tdist::checkpoint::detail::read_whole_file(path.string());
}

// 41 MiB in pieces of odd sizes: every request starts where the previous ended, asks only for
// the start of the writeback (no waiting), covers at least the window, and together they
// reach to within a window of the end; the bytes are all there after close.
TEST(WritebackAsWritten, ADurableFileHasEachFinishedWindowWrittenBack) {
  const fs::path path = fresh_dir("durable") / "file.bin";
  std::string expected;
  {
    OutputFile file(path.string(), /*block_bytes=*/0, /*durable=*/true);
    std::string piece(3 * 1000 * 1000 + 17, '\0');
    while (expected.size() < (41u << 20)) {
      for (size_t i = 0; i < piece.size(); ++i)
        piece[i] = static_cast<char>((expected.size() + i) * 131 + 7);
      file.write(piece.data(), piece.size());
      expected += piece;
    }
    const auto made = requests_for(fs::canonical(path).string());
    ASSERT_GE(made.size(), 4u);
    int64_t next = 0;
    for (const auto& r : made) {
      EXPECT_EQ(r.offset, next);
      EXPECT_GE(r.bytes, 8 << 20);
      EXPECT_EQ(r.flags, static_cast<unsigned>(SYNC_FILE_RANGE_WRITE));
      next = r.offset + r.bytes;
    }
    EXPECT_GT(next + (8 << 20), static_cast<int64_t>(expected.size()));
    file.close();
  }
  EXPECT_EQ(read_all(path), expected);
  fs::remove_all(path.parent_path());
}

TEST(WritebackAsWritten, AFileWithoutFsyncIsLeftToTheKernel) {
  const fs::path path = fresh_dir("lazy") / "file.bin";
  const std::string bytes(20 << 20, 'x');
  {
    OutputFile file(path.string(), /*block_bytes=*/0, /*durable=*/false);
    file.write(bytes.data(), bytes.size());
    file.close();
  }
  EXPECT_TRUE(requests_for(fs::canonical(path).string()).empty());
  EXPECT_EQ(read_all(path), bytes);
  fs::remove_all(path.parent_path());
}

// Both formats' shard files take the same path through a save with fsync on, and none without.
TEST(WritebackAsWritten, SavesWithFsyncWriteBackTheirShardFiles) {
  namespace ck = tdist::checkpoint;
  const std::map<std::string, at::Tensor> full = {{"w", at::arange(6 << 20, at::kFloat)}};
  for (auto format : {ck::CheckpointFormat::kTdist, ck::CheckpointFormat::kDCP}) {
    for (bool fsync : {true, false}) {
      const fs::path dir = fresh_dir("save-" + std::to_string(static_cast<int>(format)) +
                                     (fsync ? "-fsync" : "-lazy")) /
                           "ckpt";
      ck::save(ck::testing::shard_all(full, 0, 1, ck::testing::Layout::kWhole, false), {},
               dir.string(), ck::SaveOptions().format(format).fsync(fsync));
      auto target = ck::testing::shard_all(full, 0, 1, ck::testing::Layout::kWhole, true);
      ck::load(target, dir.string());
      ck::testing::expect_matches_full(target, full, "loaded");
      // The files were written in the save's hidden directory beside `dir`, then renamed.
      const size_t made = requests_under(fs::canonical(dir.parent_path()).string());
      if (fsync)
        EXPECT_GE(made, 2u) << "format " << static_cast<int>(format);
      else
        EXPECT_EQ(made, 0u) << "format " << static_cast<int>(format);
      fs::remove_all(dir.parent_path());
    }
  }
}

}  // namespace
}  // namespace writeback_test

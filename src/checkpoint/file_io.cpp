#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "checkpoint/crc32c.h"
#include "tdist/error.h"

namespace tdist::checkpoint::detail {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  TDIST_THROW(CheckpointError, "checkpoint: cannot " + what + " '" + path +
                                   "': " + std::strerror(err) +
                                   " (check the path, free space and permissions)");
}

}  // namespace

void BlockChecksummer::update(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const size_t take = std::min<size_t>(size, static_cast<size_t>(block_bytes_ - filled_));
    crc_ = crc32c(crc_, p, take);
    filled_ += static_cast<int64_t>(take);
    p += take;
    size -= take;
    if (filled_ == block_bytes_) {
      crcs_.push_back(crc_);
      crc_ = 0;
      filled_ = 0;
    }
  }
}

std::vector<uint32_t> BlockChecksummer::finish() {
  if (filled_ > 0) crcs_.push_back(crc_);
  crc_ = 0;
  filled_ = 0;
  return std::move(crcs_);
}

// Note [Writeback as written]: the kernel holds written pages in its cache and starts
// writing them out only when it chooses, so a save that ends with fsync first produces every
// byte and then waits for the disk to take them all: the two times add up. Asking for the
// writeback of each finished window (sync_file_range, SYNC_FILE_RANGE_WRITE, which does not
// wait) keeps the disk busy while the next window is serialised and checksummed, and the
// closing fsync finds little left. The fsync stays: sync_file_range neither waits nor
// flushes metadata or the disk's cache. Only durable files do this; a save without fsync
// leaves the kernel to choose, as before.
constexpr int64_t kWritebackWindow = 8 << 20;

OutputFile::OutputFile(std::string path, int64_t block_bytes, bool durable)
    : path_(std::move(path)),
      durable_(durable),
      checksummed_(block_bytes > 0),
      checksummer_(block_bytes) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("create", path_, errno);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputFile::write(const void* data, size_t size) {
  // A piece at a time: checksummed while it is still in the cache, written, and its window's
  // writeback started even when one call hands over a whole large tensor.
  constexpr size_t kPiece = 1 << 20;
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const size_t piece = std::min(size, kPiece);
    if (checksummed_) checksummer_.update(p, piece);
    write_all(p, piece);
    p += piece;
    size -= piece;
    if (durable_ && size_ - writeback_started_ >= kWritebackWindow) start_writeback();
  }
}

void OutputFile::write_all(const char* p, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", path_, errno);
    }
    p += n;
    size -= static_cast<size_t>(n);
    size_ += n;
  }
}

void OutputFile::start_writeback() {
  // Only a hint: a file system without it (EINVAL, ENOSYS) is left to the closing fsync,
  // whose own errors are the ones that count.
  (void)::sync_file_range(fd_, writeback_started_, size_ - writeback_started_,
                          SYNC_FILE_RANGE_WRITE);
  writeback_started_ = size_;
}

std::vector<uint32_t> OutputFile::close() {
  if (durable_ && ::fsync(fd_) != 0) fail("fsync", path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close", path_, errno);
  return checksummer_.finish();
}

InputFile::InputFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("open", path_, errno);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("stat", path_, errno);
  size_ = st.st_size;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(int64_t offset, void* out, int64_t size) const {
  auto* p = static_cast<char*>(out);
  while (size > 0) {
    ssize_t n = ::pread(fd_, p, static_cast<size_t>(size), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("read", path_, errno);
    }
    if (n == 0) {
      TDIST_THROW(CheckpointError, "checkpoint: file '" + path_ + "' is truncated (wanted " +
                                       std::to_string(size) + " more bytes at offset " +
                                       std::to_string(offset) + " of " + std::to_string(size_) +
                                       "); the checkpoint is corrupt, use an older one");
    }
    p += n;
    offset += n;
    size -= n;
  }
}

void write_file_atomic(const std::string& path, const std::string& bytes, bool sync) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    OutputFile out(tmp, 1 << 20, sync);
    out.write(bytes.data(), bytes.size());
    out.close();
  }
  rename_path(tmp, path);
  if (sync) fsync_dir(std::filesystem::path(path).parent_path().string());
}

std::string read_whole_file(const std::string& path) {
  InputFile in(path);
  std::string bytes(static_cast<size_t>(in.size()), '\0');
  in.read_at(0, bytes.data(), in.size());
  return bytes;
}

void fsync_dir(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open directory", d, errno);
  if (::fsync(fd) != 0 && errno != EINVAL) {
    int err = errno;
    ::close(fd);
    fail("fsync directory", d, err);
  }
  ::close(fd);
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail("rename '" + from + "' to", to, errno);
}

}  // namespace tdist::checkpoint::detail

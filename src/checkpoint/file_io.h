#pragma once

// POSIX file helpers for checkpoints: every failure is a CheckpointError naming the path
// and errno; writes are followed by fsync where durability matters.

#include <cstdint>
#include <string>
#include <vector>

namespace tdist::checkpoint::detail {

/// CRC32C of consecutive block_bytes-sized blocks of a byte stream.
class BlockChecksummer {
 public:
  explicit BlockChecksummer(int64_t block_bytes) : block_bytes_(block_bytes) {}
  void update(const void* data, size_t size);
  /// Closes the last (short) block; returns every block's CRC.
  std::vector<uint32_t> finish();

 private:
  int64_t block_bytes_;
  int64_t filled_ = 0;
  uint32_t crc_ = 0;
  std::vector<uint32_t> crcs_;
};

/// A new file written sequentially, checksummed per block as it goes (block_bytes 0: not
/// checksummed, for formats whose own checksums travel inside, such as DCP's torch.save zips).
/// A durable file is fsync'd at close, its writeback started as it is written (Note
/// [Writeback as written]).
class OutputFile {
 public:
  OutputFile(std::string path, int64_t block_bytes, bool durable);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t size);
  /// fsync (when durable) and close; returns the block checksums.
  std::vector<uint32_t> close();
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void write_all(const char* p, size_t size);
  void start_writeback();

  int fd_ = -1;
  int64_t size_ = 0;
  bool durable_;
  int64_t writeback_started_ = 0;  // bytes before this offset are on their way to the disk
  bool checksummed_;
  BlockChecksummer checksummer_;
};

/// A file read with pread at any offset.
class InputFile {
 public:
  explicit InputFile(std::string path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int64_t size() const { return size_; }
  /// Reads exactly size bytes at offset (a short file is a CheckpointError).
  void read_at(int64_t offset, void* out, int64_t size) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

/// Writes path via "<path>.tmp-<pid>": write, fsync, rename, fsync of the directory.
void write_file_atomic(const std::string& path, const std::string& bytes, bool sync);
std::string read_whole_file(const std::string& path);
void fsync_dir(const std::string& dir);
/// rename(2) with a CheckpointError naming both paths.
void rename_path(const std::string& from, const std::string& to);

}  // namespace tdist::checkpoint::detail

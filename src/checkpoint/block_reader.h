#pragma once

// Reads byte ranges of a checkpoint's data files, widening each read to whole checksum
// blocks and verifying them, so corruption anywhere in what a rank reads is caught.

#include <map>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "checkpoint/file_io.h"
#include "tdist/checkpoint/metadata.h"

namespace tdist::checkpoint::detail {

class BlockReader {
 public:
  BlockReader(std::string dir, const std::map<std::string, FileInfo>& files, bool verify);

  /// The bytes [offset, offset + size) of `file`, as a uint8 tensor whose data is 64-byte
  /// aligned when offset is. Throws CheckpointError naming the file on any mismatch.
  at::Tensor read(const std::string& file, int64_t offset, int64_t size);
  /// read() of a file without checksums (DCP's) into a buffer the reader reuses: valid until
  /// the next read_transient, so that a chunk consumed at once costs no fresh memory (page
  /// faults) each time.
  at::Tensor read_transient(const std::string& file, int64_t offset, int64_t size);
  /// Throws unless the file exists with its recorded size.
  void check_size(const std::string& file);
  /// Reads and verifies every block.
  void verify_whole(const std::string& file);
  int64_t bytes_read() const { return bytes_read_; }
  bool verifies() const { return verify_; }

 private:
  const InputFile& open(const std::string& file);
  /// open(), refusing a range outside the file.
  const InputFile& open_range(const std::string& file, int64_t offset, int64_t size);
  /// Reads out.numel() bytes at offset into `out`, checking nothing; returns out.
  at::Tensor read_unverified(const InputFile& in, int64_t offset, at::Tensor out);

  std::string dir_;
  const std::map<std::string, FileInfo>& files_;
  bool verify_;
  std::map<std::string, std::unique_ptr<InputFile>> open_;
  int64_t bytes_read_ = 0;
  at::Tensor transient_;  // grow-only, for read_transient
};

}  // namespace tdist::checkpoint::detail

#pragma once

// safetensors read a row range at a time: what loading a model folder into FSDP shards
// needs, where each rank reads only the rows of its own shards, converting their dtype on the
// way, and never a whole tensor it does not own. Rows go from the file straight into the
// destination when dtypes match (pread: one copy out of the page cache, nothing mapped, so
// a rank's resident memory is what it keeps), else through a bounce buffer of a few MiB.
//
// A file's header is validated when it is opened, before any tensor is read: its length,
// its JSON, each entry's dtype and shape, and its data offsets, which must match the
// shape, lie inside the file (a truncated file fails here, naming the tensor that runs
// past its end) and not overlap another tensor's. Every error is a CheckpointError naming
// the file and the tensor.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace tdist::checkpoint {

/// One tensor of a safetensors header.
struct SafetensorsEntry {
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> shape;
  int64_t data_begin = 0;  ///< offset of its first byte from the start of the file
  int64_t nbytes = 0;
};

/// One safetensors file, open for reading for as long as the object lives.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  /// The header's "__metadata__" (Hugging Face writes {"format": "pt"}).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Throws CheckpointError naming the file when it has no tensor `name`.
  const SafetensorsEntry& entry(const std::string& name) const;

  /// Copies rows [row_begin, row_begin + out.size(0)) of dim 0 of tensor `name` into `out`,
  /// converting to out's dtype and device (a 0-dim tensor has one row, and `out` is 0-dim
  /// or holds one element). out's trailing dims must match the tensor's.
  void read_rows(const std::string& name, int64_t row_begin, const at::Tensor& out) const;

 private:
  void read_exactly(int64_t offset, void* out, int64_t size) const;

  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// The safetensors of a model folder as Hugging Face lays it out: `<base>.safetensors`, or
/// the shards `<base>.safetensors.index.json` names. The index must name existing files
/// that hold the tensors it says they do; a tensor in two files is refused.
class SafetensorsFolder {
 public:
  explicit SafetensorsFolder(const std::string& dir, const std::string& base_name = "model");

  const std::string& dir() const { return dir_; }
  /// Every tensor's name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return file_of_.count(name) != 0; }
  /// Throws CheckpointError naming the folder when it has no tensor `name`.
  const SafetensorsFile& file_of(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const { return file_of(name).entry(name); }
  void read_rows(const std::string& name, int64_t row_begin, const at::Tensor& out) const {
    file_of(name).read_rows(name, row_begin, out);
  }
  /// Bytes of tensor data in all the files.
  int64_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> file_of_;
};

}  // namespace tdist::checkpoint

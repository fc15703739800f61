#pragma once

// The layout of a Hugging Face safetensors export, computed alike on every rank from the
// tensors' names, dtypes and shapes alone (Note [Saving from shards] in pretrained.h), and
// the two writes that fill it: each file's header, and a tensor's rows at their offset.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace tdist::models::detail {

struct TensorSpec {
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
};

struct PlannedTensor {
  size_t file = 0;         ///< index into ExportLayout::files
  int64_t data_begin = 0;  ///< offset of its first byte in the file
  int64_t row_bytes = 0;   ///< bytes per row of dim 0 (a 0-dim tensor has one row)
};

struct PlannedFile {
  std::string name;    ///< "model.safetensors" or "model-00001-of-00003.safetensors"
  std::string header;  ///< the first bytes of the file: length, JSON, padding
  int64_t size = 0;    ///< the whole file
};

struct ExportLayout {
  std::vector<PlannedFile> files;
  std::map<std::string, PlannedTensor> tensors;
  /// model.safetensors.index.json's text, "" for a single file.
  std::string index_json;
};

/// transformers' split: tensors in name order, a new file whenever the next tensor would take
/// the current one past max_shard_bytes.
ExportLayout plan_export(const std::map<std::string, TensorSpec>& tensors, int64_t max_shard_bytes);

/// Creates `path` holding the file's header, sized to the whole file (its data still zero).
void create_sized_file(const std::string& path, const PlannedFile& file);

/// Writes rows [row_begin, row_begin + rows.size(0)) of a tensor at their place in `path`;
/// `rows` is converted to `dtype` first.
void write_rows(const std::string& path, const PlannedTensor& where, int64_t row_begin,
                const at::Tensor& rows, c10::ScalarType dtype);

/// fsync: what this process wrote to `path` is on disk.
void sync_file(const std::string& path);

}  // namespace tdist::models::detail

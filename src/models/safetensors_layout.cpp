#include "models/safetensors_layout.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "tdist/error.h"

namespace tdist::models::detail {
namespace {

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return "F32";
    case c10::kBFloat16:
      return "BF16";
    case c10::kHalf:
      return "F16";
    case c10::kDouble:
      return "F64";
    case c10::kLong:
      return "I64";
    case c10::kInt:
      return "I32";
    case c10::kBool:
      return "BOOL";
    default:
      TDIST_THROW(InvalidArgument, std::string("save_pretrained: cannot save dtype ") +
                                       c10::toString(t) + " in safetensors");
  }
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string file_name(size_t index, size_t count) {
  if (count == 1) return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

[[noreturn]] void io_error(const std::string& what, const std::string& path, int err) {
  TDIST_THROW(CheckpointError, "save_pretrained: cannot " + what + " '" + path +
                                   "': " + std::strerror(err) +
                                   " (check the path, free space and permissions)");
}

// pwrite of all `size` bytes; closes fd and throws on failure.
void write_at(int fd, const std::string& path, const void* data, size_t size, off_t offset) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, p, size, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      io_error("write", path, err);
    }
    p += n;
    offset += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

ExportLayout plan_export(const std::map<std::string, TensorSpec>& tensors,
                         int64_t max_shard_bytes) {
  std::vector<std::vector<std::string>> groups(1);
  int64_t bytes = 0;
  for (const auto& [name, spec] : tensors) {
    const int64_t n = numel(spec.shape) * static_cast<int64_t>(c10::elementSize(spec.dtype));
    if (!groups.back().empty() && bytes + n > max_shard_bytes) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(name);
    bytes += n;
  }
  ExportLayout layout;
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total = 0;
  for (size_t f = 0; f < groups.size(); ++f) {
    PlannedFile file;
    file.name = file_name(f, groups.size());
    nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
    int64_t offset = 0;
    std::map<std::string, int64_t> relative;
    for (const auto& name : groups[f]) {
      const TensorSpec& spec = tensors.at(name);
      const int64_t n = numel(spec.shape) * static_cast<int64_t>(c10::elementSize(spec.dtype));
      header[name] = {{"dtype", dtype_name(spec.dtype)},
                      {"shape", spec.shape},
                      {"data_offsets", {offset, offset + n}}};
      relative[name] = offset;
      offset += n;
      weight_map[name] = file.name;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
    const uint64_t length = text.size();
    file.header.assign(8, '\0');
    std::memcpy(file.header.data(), &length, 8);
    file.header += text;
    const int64_t data_start = static_cast<int64_t>(file.header.size());
    file.size = data_start + offset;
    total += offset;
    for (const auto& [name, rel] : relative) {
      const TensorSpec& spec = tensors.at(name);
      const int64_t rows = spec.shape.empty() ? 1 : spec.shape[0];
      const int64_t n = numel(spec.shape) * static_cast<int64_t>(c10::elementSize(spec.dtype));
      layout.tensors[name] = {f, data_start + rel, rows == 0 ? 0 : n / rows};
    }
    layout.files.push_back(std::move(file));
  }
  if (layout.files.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
    layout.index_json = index.dump(2) + "\n";
  }
  return layout;
}

void create_sized_file(const std::string& path, const PlannedFile& file) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_error("create", path, errno);
  write_at(fd, path, file.header.data(), file.header.size(), 0);
  if (::ftruncate(fd, file.size) != 0) {
    const int err = errno;
    ::close(fd);
    io_error("size", path, err);
  }
  ::close(fd);
}

void write_rows(const std::string& path, const PlannedTensor& where, int64_t row_begin,
                const at::Tensor& rows, c10::ScalarType dtype) {
  if (rows.numel() == 0) return;
  const at::Tensor data = rows.detach().to(at::kCPU, dtype).contiguous();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) io_error("open", path, errno);
  write_at(fd, path, data.data_ptr(), data.nbytes(),
           where.data_begin + row_begin * where.row_bytes);
  ::close(fd);
}

void sync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error("open", path, errno);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    io_error("sync", path, err);
  }
  ::close(fd);
}

}  // namespace tdist::models::detail

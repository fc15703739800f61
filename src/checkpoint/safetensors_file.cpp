#include "tdist/checkpoint/safetensors_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include "tdist/error.h"

namespace tdist::checkpoint {
namespace {

namespace fs = std::filesystem;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors code assumes little-endian");

// The reference implementation refuses headers over 100 MB; so do we.
constexpr uint64_t kMaxHeader = 100u * 1000 * 1000;

[[noreturn]] void bad_file(const std::string& path, const std::string& why) {
  TDIST_THROW(CheckpointError, "safetensors: '" + path + "' " + why);
}

// safetensors' dtype names; the ones ATen has no type for, or tdist does not load, are
// named in the error so that the user knows to convert the file.
c10::ScalarType dtype_of(const std::string& path, const std::string& tensor,
                         const std::string& name) {
  static const std::map<std::string, c10::ScalarType> kTypes = {
      {"F64", c10::kDouble}, {"F32", c10::kFloat}, {"F16", c10::kHalf},  {"BF16", c10::kBFloat16},
      {"I64", c10::kLong},   {"I32", c10::kInt},   {"I16", c10::kShort}, {"I8", c10::kChar},
      {"U8", c10::kByte},    {"BOOL", c10::kBool}};
  auto it = kTypes.find(name);
  if (it == kTypes.end()) {
    bad_file(path, "stores tensor '" + tensor + "' as " + name +
                       ", a dtype tdist does not load (it loads F64, F32, F16, BF16, I64, I32, "
                       "I16, I8, U8 and BOOL); convert the file, e.g. to BF16 or F32");
  }
  return it->second;
}

int64_t checked_numel(const std::string& path, const std::string& name,
                      const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && numel > (int64_t(1) << 50) / d)) {
      bad_file(path, "gives tensor '" + name + "' an impossible shape");
    }
    numel *= d;
  }
  return numel;
}

std::string range_text(int64_t b, int64_t e) {
  return "[" + std::to_string(b) + ", " + std::to_string(e) + ")";
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) bad_file(path, std::string("cannot be opened: ") + std::strerror(errno));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0)
      bad_file(path, std::string("cannot be read: ") + std::strerror(errno));
    size_ = st.st_size;
    if (size_ < 8) {
      bad_file(path, "is shorter than a safetensors header (" + std::to_string(size_) +
                         " bytes; truncated?)");
    }
    uint64_t n = 0;
    read_exactly(0, &n, 8);
    if (n > kMaxHeader || n > static_cast<uint64_t>(size_ - 8)) {
      bad_file(path, "declares a header of " + std::to_string(n) + " bytes, past the end of the " +
                         std::to_string(size_) + "-byte file (truncated or not safetensors)");
    }
    std::string text(n, '\0');
    read_exactly(8, text.data(), static_cast<int64_t>(n));
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      bad_file(path, std::string("has a header that is not JSON: ") + e.what());
    }
    if (!header.is_object()) bad_file(path, "has a header that is not a JSON object");
    const int64_t data_start = 8 + static_cast<int64_t>(n);
    std::vector<std::pair<std::pair<int64_t, int64_t>, std::string>> ranges;
    for (const auto& [name, item] : header.items()) {
      if (name == "__metadata__") {
        if (!item.is_object()) bad_file(path, "has a __metadata__ that is not an object");
        for (const auto& [k, v] : item.items()) {
          if (!v.is_string()) {
            bad_file(path, "has a __metadata__ value that is not a string ('" + k + "')");
          }
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      if (!item.is_object() || !item.contains("dtype") || !item.contains("shape") ||
          !item.contains("data_offsets") || !item["dtype"].is_string() ||
          !item["shape"].is_array() || !item["data_offsets"].is_array() ||
          item["data_offsets"].size() != 2) {
        bad_file(path, "has a malformed header entry for '" + name +
                           "' (needs dtype, shape and two data_offsets)");
      }
      SafetensorsEntry entry;
      entry.dtype = dtype_of(path, name, item["dtype"].get<std::string>());
      entry.shape = item["shape"].get<std::vector<int64_t>>();
      const auto offsets = item["data_offsets"].get<std::vector<int64_t>>();
      const int64_t expected = checked_numel(path, name, entry.shape) *
                               static_cast<int64_t>(c10::elementSize(entry.dtype));
      if (offsets[0] < 0 || offsets[1] < offsets[0] || offsets[1] - offsets[0] != expected) {
        bad_file(path, "gives tensor '" + name + "' data_offsets " +
                           range_text(offsets[0], offsets[1]) + ", which do not hold its " +
                           std::to_string(expected) + " bytes");
      }
      if (data_start + offsets[1] > size_) {
        bad_file(path, "ends before the data of tensor '" + name + "' (its bytes " +
                           range_text(offsets[0], offsets[1]) + " run past the " +
                           std::to_string(size_ - data_start) +
                           " bytes of data in the file; truncated?)");
      }
      entry.data_begin = data_start + offsets[0];
      entry.nbytes = expected;
      ranges.push_back({{offsets[0], offsets[1]}, name});
      entries_.emplace(name, std::move(entry));
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first.first < ranges[i - 1].first.second) {
        bad_file(path, "has overlapping tensors: '" + ranges[i - 1].second + "' " +
                           range_text(ranges[i - 1].first.first, ranges[i - 1].first.second) +
                           " and '" + ranges[i].second + "' " +
                           range_text(ranges[i].first.first, ranges[i].first.second));
      }
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsFile::read_exactly(int64_t offset, void* out, int64_t size) const {
  auto* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd_, p, static_cast<size_t>(size), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      bad_file(path_, n == 0 ? std::string("ended early (truncated while being read?)")
                             : std::string("cannot be read: ") + std::strerror(errno));
    }
    p += n;
    offset += n;
    size -= n;
  }
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) bad_file(path_, "has no tensor '" + name + "'");
  return it->second;
}

void SafetensorsFile::read_rows(const std::string& name, int64_t row_begin,
                                const at::Tensor& out) const {
  const SafetensorsEntry& e = entry(name);
  std::vector<int64_t> row_shape = e.shape.empty() ? std::vector<int64_t>{1} : e.shape;
  const int64_t rows_total = row_shape[0];
  const std::vector<int64_t> trailing(row_shape.begin() + 1, row_shape.end());
  const int64_t rows = out.dim() == 0 ? 1 : out.size(0);
  const std::vector<int64_t> out_trailing =
      out.dim() == 0 ? std::vector<int64_t>{} : out.sizes().slice(1).vec();
  TDIST_CHECK_ARG(out_trailing == trailing || (e.shape.empty() && out.numel() == 1),
                  "safetensors: reading '" + name + "' of '" + path_ + "' into a tensor of shape " +
                      c10::str(out.sizes()) + ", whose trailing dims differ from the file's " +
                      c10::str(c10::IntArrayRef(e.shape)));
  TDIST_CHECK_ARG(row_begin >= 0 && row_begin + rows <= rows_total,
                  "safetensors: rows " + range_text(row_begin, row_begin + rows) + " of '" + name +
                      "' are outside its " + std::to_string(rows_total) + " rows");
  if (rows == 0) return;
  int64_t row_elems = 1;
  for (int64_t d : trailing) row_elems *= d;
  const int64_t row_bytes = row_elems * static_cast<int64_t>(c10::elementSize(e.dtype));
  const int64_t begin = e.data_begin + row_begin * row_bytes;
  at::NoGradGuard no_grad;
  if (out.is_cpu() && out.is_contiguous() && out.scalar_type() == e.dtype) {
    // Straight from the page cache into the destination: one copy, as reading the file does.
    read_exactly(begin, out.data_ptr(), rows * row_bytes);
    return;
  }
  if (!out.is_contiguous()) {  // rows of a strided view: read them whole, then place them
    at::Tensor whole =
        at::empty(out.sizes(), out.options().memory_format(at::MemoryFormat::Contiguous));
    read_rows(name, row_begin, whole);
    out.copy_(whole);
    return;
  }
  // Another dtype or device: through a bounce buffer of a few MiB at a time.
  const at::Tensor flat = out.view({rows, row_elems});
  const int64_t chunk_rows =
      std::max<int64_t>(1, (int64_t(8) << 20) / std::max<int64_t>(1, row_bytes));
  at::Tensor bounce =
      at::empty({std::min(chunk_rows, rows), row_elems}, at::TensorOptions().dtype(e.dtype));
  for (int64_t r = 0; r < rows; r += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r);
    at::Tensor part = bounce.narrow(0, 0, n);
    read_exactly(begin + r * row_bytes, part.data_ptr(), n * row_bytes);
    flat.narrow(0, r, n).copy_(part);
  }
}

SafetensorsFolder::SafetensorsFolder(const std::string& dir, const std::string& base_name)
    : dir_(dir) {
  const fs::path index_path = fs::path(dir) / (base_name + ".safetensors.index.json");
  const fs::path single = fs::path(dir) / (base_name + ".safetensors");
  if (!fs::exists(index_path)) {
    if (!fs::exists(single)) {
      TDIST_THROW(CheckpointError, "safetensors: '" + dir + "' holds neither " +
                                       single.filename().string() + " nor " +
                                       index_path.filename().string());
    }
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const auto& [name, entry] : files_.back()->entries()) file_of_[name] = files_.back().get();
    return;
  }
  const std::string where = "safetensors: index '" + index_path.string() + "'";
  nlohmann::json index;
  try {
    std::ifstream in(index_path);
    index = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    TDIST_THROW(CheckpointError, where + " is not JSON: " + e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    TDIST_THROW(CheckpointError, where + " has no \"weight_map\" object");
  }
  std::map<std::string, std::set<std::string>> names_by_file;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      TDIST_THROW(CheckpointError, where + ": the file of '" + name + "' is not a string");
    }
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      TDIST_THROW(CheckpointError, where + ": '" + f + "' is not a file name in the folder");
    }
    names_by_file[f].insert(name);
  }
  for (const auto& [file, names] : names_by_file) {
    const fs::path path = fs::path(dir) / file;
    if (!fs::exists(path)) {
      TDIST_THROW(CheckpointError, where + " names shard '" + file +
                                       "', which is missing (an incomplete download?)");
    }
    files_.push_back(std::make_unique<SafetensorsFile>(path.string()));
    const SafetensorsFile* shard = files_.back().get();
    for (const auto& name : names) {
      if (shard->entries().count(name) == 0) {
        TDIST_THROW(CheckpointError,
                    where + " says '" + name + "' is in '" + file + "', which does not hold it");
      }
      file_of_[name] = shard;
    }
    for (const auto& [name, entry] : shard->entries()) {
      if (names.count(name) == 0) {
        TDIST_THROW(CheckpointError,
                    "safetensors: '" + path.string() + "' holds '" + name +
                        "', which the index places " +
                        (index["weight_map"].contains(name) ? "in another file" : "nowhere"));
      }
    }
  }
}

std::vector<std::string> SafetensorsFolder::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : file_of_) out.push_back(name);
  return out;
}

const SafetensorsFile& SafetensorsFolder::file_of(const std::string& name) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) {
    TDIST_THROW(CheckpointError,
                "safetensors: the model in '" + dir_ + "' has no tensor '" + name + "'");
  }
  return *it->second;
}

int64_t SafetensorsFolder::total_bytes() const {
  int64_t total = 0;
  for (const auto& file : files_) {
    for (const auto& [name, entry] : file->entries()) total += entry.nbytes;
  }
  return total;
}

}  // namespace tdist::checkpoint

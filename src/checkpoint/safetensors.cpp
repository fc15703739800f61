// safetensors: <u64 little-endian header size N><N bytes of JSON, space-padded><data>.
// Header: {"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [b, e]}},
// offsets relative to the start of the data; tensors stored little-endian, row-major.

#include <cstring>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "checkpoint/dtype.h"
#include "checkpoint/file_io.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/checkpoint/safetensors_file.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors code assumes little-endian");

void save_safetensors(const TensorMap& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    TDIST_CHECK_ARG(name != "__metadata__", "save_safetensors: '__metadata__' is reserved");
    TDIST_CHECK_ARG(t.defined(), "save_safetensors: tensor '" + name + "' is undefined");
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    header[name] = {{"dtype", detail::dtype_name(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + static_cast<int64_t>(c.nbytes())}}};
    offset += static_cast<int64_t>(c.nbytes());
    data.push_back(std::move(c));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::string bytes(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes += text;
  bytes.reserve(bytes.size() + static_cast<size_t>(offset));
  for (const auto& c : data) bytes.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
  detail::write_file_atomic(path, bytes, true);
}

// One parser of the format: SafetensorsFile validates the header (lengths, dtypes, offsets
// inside the file, no overlaps) and reads each tensor whole.
TensorMap load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  const SafetensorsFile file(path);
  if (metadata != nullptr) *metadata = file.metadata();
  TensorMap out;
  for (const auto& [name, entry] : file.entries()) {
    at::Tensor t = at::empty(entry.shape, at::TensorOptions().dtype(entry.dtype));
    file.read_rows(name, 0, t);
    out[name] = std::move(t);
  }
  return out;
}

}  // namespace tdist::checkpoint

// safetensors: <u64 little-endian header size N><N bytes of JSON, space-padded><data>.
// Header: {"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [b, e]}},
// offsets relative to the start of the data; tensors stored little-endian, row-major.

#include <cstring>
#include <filesystem>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "checkpoint/dtype.h"
#include "checkpoint/file_io.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors code assumes little-endian");

// The reference implementation refuses headers over 100 MB; so do we.
constexpr uint64_t kMaxHeader = 100u * 1000 * 1000;

[[noreturn]] void bad_file(const std::string& path, const std::string& why) {
  TDIST_THROW(CheckpointError,
              "load_safetensors: '" + path + "' is not a valid safetensors file (" + why + ")");
}

}  // namespace

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

TensorMap load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  detail::InputFile in(path);
  if (in.size() < 8) bad_file(path, "shorter than 8 bytes");
  uint64_t n = 0;
  in.read_at(0, &n, 8);
  if (n > kMaxHeader || n > static_cast<uint64_t>(in.size() - 8)) {
    bad_file(path, "header length " + std::to_string(n) + " exceeds the file");
  }
  std::string text(n, '\0');
  in.read_at(8, text.data(), static_cast<int64_t>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    bad_file(path, std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) bad_file(path, "header is not a JSON object");
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  const int64_t data_size = in.size() - data_start;
  TensorMap out;
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (metadata != nullptr) *metadata = entry.get<std::map<std::string, std::string>>();
        continue;
      }
      const auto dtype =
          detail::dtype_from_name(entry.at("dtype").get<std::string>(), "'" + path + "'");
      const auto shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<int64_t>>();
      if (offsets.size() != 2) bad_file(path, "'" + name + "': data_offsets needs 2 values");
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
      if (offsets[0] < 0 || offsets[1] < offsets[0] || offsets[1] > data_size ||
          offsets[1] - offsets[0] != static_cast<int64_t>(t.nbytes())) {
        bad_file(path, "'" + name + "': data_offsets [" + std::to_string(offsets[0]) + ", " +
                           std::to_string(offsets[1]) + "] do not fit its shape or the file");
      }
      in.read_at(data_start + offsets[0], t.data_ptr(), static_cast<int64_t>(t.nbytes()));
      out[name] = std::move(t);
    }
  } catch (const nlohmann::json::exception& e) {
    bad_file(path, e.what());
  }
  return out;
}

}  // namespace tdist::checkpoint

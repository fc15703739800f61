#include "checkpoint/metadata_codec.h"

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint/crc32c.h"
#include "checkpoint/dcp_metadata.h"
#include "checkpoint/file_io.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace detail {
namespace {

using nlohmann::json;
constexpr const char* kMagic = "tdist-checkpoint";

[[noreturn]] void corrupt(const std::string& path, const std::string& why) {
  TDIST_THROW(CheckpointError, "checkpoint: metadata file '" + path + "' is corrupt (" + why +
                                   "); the checkpoint cannot be loaded, use an older one");
}

}  // namespace

std::string base64_encode(const std::vector<uint8_t>& bytes) {
  static const char* kChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
    for (int k = 3; k >= 0; --k) out.push_back(kChars[(v >> (6 * k)) & 63]);
  }
  if (i < bytes.size()) {
    uint32_t v = bytes[i] << 16;
    if (i + 1 < bytes.size()) v |= bytes[i + 1] << 8;
    out.push_back(kChars[(v >> 18) & 63]);
    out.push_back(kChars[(v >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? kChars[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::vector<uint8_t> base64_decode(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    int v = value(c);
    if (v < 0) TDIST_THROW(CheckpointError, "checkpoint: invalid base64 in extra state");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>((acc >> bits) & 0xff));
    }
  }
  return out;
}

std::string encode_metadata(const CheckpointMetadata& m) {
  json j;
  j["version"] = m.version;
  j["world_size"] = m.world_size;
  json tensors = json::object();
  for (const auto& [name, t] : m.tensors) {
    json chunks = json::array();
    for (const auto& c : t.chunks) {
      chunks.push_back({{"offsets", c.offsets},
                        {"sizes", c.sizes},
                        {"file", c.file},
                        {"byte_offset", c.byte_offset},
                        {"byte_length", c.byte_length}});
    }
    tensors[name] = {{"dtype", t.dtype}, {"global_shape", t.global_shape}, {"chunks", chunks}};
  }
  j["tensors"] = std::move(tensors);
  json files = json::object();
  for (const auto& [name, f] : m.files) {
    files[name] = {{"rank", f.rank},
                   {"size", f.size},
                   {"block_bytes", f.block_bytes},
                   {"block_crc32c", f.block_crc32c}};
  }
  j["files"] = std::move(files);
  json extra = json::array();
  for (const auto& e : m.extra_per_rank) extra.push_back(e.to_json());
  j["extra_per_rank"] = std::move(extra);

  const std::string body = j.dump(1);
  char header[128];
  std::snprintf(header, sizeof(header), "%s v%d crc32c=%08x bytes=%zu\n", kMagic, m.version,
                crc32c(0, body.data(), body.size()), body.size());
  return header + body;
}

CheckpointMetadata decode_metadata(const std::string& bytes, const std::string& path) {
  const auto newline = bytes.find('\n');
  if (newline == std::string::npos) corrupt(path, "no header line");
  const std::string header = bytes.substr(0, newline);
  int version = 0;
  unsigned crc = 0;
  size_t length = 0;
  if (std::sscanf(header.c_str(), "tdist-checkpoint v%d crc32c=%8x bytes=%zu", &version, &crc,
                  &length) != 3) {
    corrupt(path, "bad header line '" + header.substr(0, 80) + "'");
  }
  if (version != kFormatVersion) {
    TDIST_THROW(CheckpointError, "checkpoint: '" + path + "' has format version " +
                                     std::to_string(version) + ", this build reads version " +
                                     std::to_string(kFormatVersion));
  }
  const std::string body = bytes.substr(newline + 1);
  if (body.size() != length) {
    corrupt(path, "expected " + std::to_string(length) + " bytes of JSON, found " +
                      std::to_string(body.size()));
  }
  if (crc32c(0, body.data(), body.size()) != crc) corrupt(path, "checksum mismatch");

  CheckpointMetadata m;
  try {
    const json j = json::parse(body);
    m.version = j.at("version").get<int>();
    m.world_size = j.at("world_size").get<int>();
    for (const auto& [name, t] : j.at("tensors").items()) {
      TensorInfo info;
      info.dtype = t.at("dtype").get<std::string>();
      info.global_shape = t.at("global_shape").get<std::vector<int64_t>>();
      for (const auto& c : t.at("chunks")) {
        ChunkInfo chunk;
        chunk.offsets = c.at("offsets").get<std::vector<int64_t>>();
        chunk.sizes = c.at("sizes").get<std::vector<int64_t>>();
        chunk.file = c.at("file").get<std::string>();
        chunk.byte_offset = c.at("byte_offset").get<int64_t>();
        chunk.byte_length = c.at("byte_length").get<int64_t>();
        info.chunks.push_back(std::move(chunk));
      }
      m.tensors.emplace(name, std::move(info));
    }
    for (const auto& [name, f] : j.at("files").items()) {
      FileInfo info;
      info.rank = f.at("rank").get<int>();
      info.size = f.at("size").get<int64_t>();
      info.block_bytes = f.at("block_bytes").get<int64_t>();
      info.block_crc32c = f.at("block_crc32c").get<std::vector<uint32_t>>();
      m.files.emplace(name, std::move(info));
    }
    for (const auto& e : j.at("extra_per_rank"))
      m.extra_per_rank.push_back(ExtraState::from_json(e));
  } catch (const nlohmann::json::exception& e) {
    corrupt(path, e.what());
  }
  return m;
}

}  // namespace detail

std::string to_string(CheckpointFormat format) {
  return format == CheckpointFormat::kDCP ? "dcp" : "tdist";
}

CheckpointMetadata read_metadata(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kMetadataFile).string();
  if (std::filesystem::exists(path)) {
    return detail::decode_metadata(detail::read_whole_file(path), path);
  }
  if (std::filesystem::exists(std::filesystem::path(dir) / kDCPMetadataFile)) {
    return detail::read_dcp_metadata(dir);
  }
  TDIST_THROW(CheckpointError, "checkpoint: no '" + std::string(kMetadataFile) + "' (tdist) or '" +
                                   kDCPMetadataFile + "' (torch.distributed.checkpoint) in '" +
                                   dir + "': not a checkpoint, or its save never committed");
}

}  // namespace tdist::checkpoint

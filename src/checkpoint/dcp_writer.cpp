#include "checkpoint/dcp_writer.h"

#include <cstdio>
#include <filesystem>

#include "checkpoint/file_io.h"
#include "checkpoint/torch_blob.h"

namespace tdist::checkpoint::detail {

nlohmann::json write_dcp_file(const std::vector<SliceToWrite>& slices,
                              const std::string* extra_state_json,
                              const std::vector<std::pair<std::string, c10::IValue>>& objects,
                              int rank, const std::string& dir, bool fsync,
                              const std::function<void()>& halfway) {
  nlohmann::json out = {
      {"file", nullptr}, {"chunks", nlohmann::json::array()}, {"objects", nlohmann::json::array()}};
  if (slices.empty() && extra_state_json == nullptr && objects.empty()) {
    halfway();
    return out;
  }
  char name[32];
  std::snprintf(name, sizeof(name), "__%d_0.distcp", rank);
  // No block checksums: each record is a torch.save zip whose entries carry zip's CRC-32,
  // which the reader checks (the DCP metadata has no place for ours).
  OutputFile file((std::filesystem::path(dir) / name).string(), /*block_bytes=*/0, fsync);
  // Each value is torch.save'd straight into the file: its length is what was written.
  auto append = [&](const c10::IValue& value) {
    const int64_t offset = file.size();
    torch_save_to(value, [&](const void* data, size_t size) { file.write(data, size); });
    return nlohmann::json{
        {"file", name}, {"byte_offset", offset}, {"byte_length", file.size() - offset}};
  };
  if (extra_state_json != nullptr) {
    const auto where = append(c10::IValue(*extra_state_json));
    out["extra_state"] = {
        {"file", name}, {"offset", where.at("byte_offset")}, {"length", where.at("byte_length")}};
  }
  for (const auto& [object_name, value] : objects) {
    const auto where = append(value);
    out["objects"].push_back({{"name", object_name},
                              {"file", name},
                              {"offset", where.at("byte_offset")},
                              {"length", where.at("byte_length")}});
  }
  bool injected = false;
  for (size_t i = 0; i < slices.size(); ++i) {
    const SliceToWrite& s = slices[i];
    auto record = append(c10::IValue(s.data));
    record["name"] = s.name;
    record["offsets"] = s.offsets;
    record["sizes"] = s.data.sizes().vec();
    out["chunks"].push_back(std::move(record));
    if (!injected && 2 * (i + 1) >= slices.size()) {
      injected = true;
      halfway();
    }
  }
  if (!injected) halfway();
  const int64_t size = file.size();
  file.close();
  out["file"] = {{"name", name},
                 {"rank", rank},
                 {"size", size},
                 {"block_bytes", 0},
                 {"block_crc32c", nlohmann::json::array()}};
  return out;
}

}  // namespace tdist::checkpoint::detail

// save_pretrained: Note [Saving from shards] in tdist/models/pretrained.h.

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "models/safetensors_layout.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/object_collectives.h"
#include "tdist/error.h"
#include "tdist/fsdp/state_dict.h"
#include "tdist/models/pretrained.h"

namespace tdist::models {
namespace {

namespace fs = std::filesystem;

const char* const kCopiedFiles[] = {"tokenizer.json",     "tokenizer_config.json",
                                    "tokenizer.model",    "special_tokens_map.json",
                                    "vocab.json",         "merges.txt",
                                    "added_tokens.json",  "generation_config.json",
                                    "chat_template.jinja"};

// One stage of a save that every rank runs: a failure on any rank fails it on all, naming
// each failed rank's error, so no rank goes on to rename a folder another could not fill.
class Stages {
 public:
  Stages(bool collective, std::string staging)
      : collective_(collective), staging_(std::move(staging)) {}

  void run(const std::string& stage, const std::function<void()>& step) {
    std::string error;
    try {
      step();
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::string failures = error;
    if (collective_) {
      std::vector<Object> all;
      all_gather_object(all, Object(error));
      failures.clear();
      for (size_t r = 0; r < all.size(); ++r) {
        if (!all[r].as_string().empty()) {
          failures += (failures.empty() ? "rank " : "; rank ") + std::to_string(r) + ": " +
                      all[r].as_string();
        }
      }
    }
    if (failures.empty()) return;
    if (!collective_ || get_rank() == 0) {
      std::error_code ignored;
      fs::remove_all(staging_, ignored);
    }
    TDIST_THROW(CheckpointError,
                "save_pretrained: " + stage + " failed, nothing was saved (" + failures + ")");
  }

 private:
  bool collective_;
  std::string staging_;
};

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.flush();
  if (!out) TDIST_THROW(CheckpointError, "save_pretrained: cannot write '" + path.string() + "'");
}

void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string generation_config(const ModelConfig& c) {
  nlohmann::json j = {{"_from_model_config", true}};
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j.dump(2) + "\n";
}

// Rank 0's last stage: what is not a tensor, then the folder swapped into place.
std::vector<std::string> finish_folder(const fs::path& staging, const fs::path& dir,
                                       const detail::ExportLayout& layout,
                                       const ModelConfig& config, const SaveOptions& options) {
  std::vector<std::string> written;
  for (const auto& file : layout.files) written.push_back(file.name);
  if (!layout.index_json.empty()) {
    write_text(staging / "model.safetensors.index.json", layout.index_json);
    written.push_back("model.safetensors.index.json");
  }
  write_text(staging / "config.json", config.to_json());
  written.push_back("config.json");
  if (!options.files_from().empty()) {
    for (const char* name : kCopiedFiles) {
      const fs::path from = fs::path(options.files_from()) / name;
      if (!fs::exists(from)) continue;
      fs::copy_file(from, staging / name, fs::copy_options::overwrite_existing);
      written.push_back(name);
    }
  }
  if (!fs::exists(staging / "generation_config.json")) {
    write_text(staging / "generation_config.json", generation_config(config));
    written.push_back("generation_config.json");
  }
  for (const auto& name : written) {
    if (name.find(".safetensors") == std::string::npos)
      detail::sync_file((staging / name).string());
  }
  sync_dir(staging);
  // A previous export is removed only once the new one is complete beside it.
  const fs::path old = dir.string() + ".tdist-old";
  fs::remove_all(old);
  if (fs::exists(dir)) fs::rename(dir, old);
  fs::rename(staging, dir);
  fs::remove_all(old);
  sync_dir(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
  return written;
}

}  // namespace

std::vector<std::string> save_pretrained(const CausalLM& model, const std::string& dir,
                                         const SaveOptions& options) {
  TDIST_CHECK_ARG(!dir.empty(), "save_pretrained: the folder is empty");
  TDIST_CHECK_ARG(options.max_shard_bytes() > 0,
                  "save_pretrained: max_shard_bytes must be positive");
  const ShardedStateDict state = fsdp::get_model_state_dict(model);
  ModelConfig config = model.config();
  std::map<std::string, detail::TensorSpec> specs;
  bool dtype_set = false;
  for (const auto& [name, slice] : state) {
    c10::ScalarType dtype = slice.local.scalar_type();
    if (at::isFloatingType(dtype)) {
      dtype = options.dtype().value_or(dtype);
      if (!dtype_set) config.dtype = dtype;
      dtype_set = true;
    }
    specs[name] = {dtype, slice.global_shape};
  }
  const detail::ExportLayout layout = detail::plan_export(specs, options.max_shard_bytes());
  const bool collective = is_initialized() && get_world_size() > 1;
  const int rank = collective ? get_rank() : 0;
  fs::path target = fs::absolute(fs::path(dir)).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  const fs::path staging = target.string() + ".tdist-partial";
  Stages stages(collective, staging.string());

  stages.run("creating the files", [&] {
    if (rank != 0) return;
    fs::remove_all(staging);
    fs::create_directories(staging);
    for (const auto& file : layout.files) {
      detail::create_sized_file((staging / file.name).string(), file);
    }
  });
  stages.run("writing the tensors", [&] {
    std::set<size_t> touched;
    for (const auto& [name, slice] : state) {
      // A whole tensor (a buffer, an unsharded parameter) is every rank's: rank 0 writes it.
      const bool whole = slice.local.sizes() == c10::IntArrayRef(slice.global_shape);
      if ((whole && rank != 0) || slice.local.numel() == 0) continue;
      const detail::PlannedTensor& where = layout.tensors.at(name);
      const std::string path = (staging / layout.files[where.file].name).string();
      const int64_t row = slice.offsets.empty() ? 0 : slice.offsets[0];
      detail::write_rows(path, where, row, slice.local, specs.at(name).dtype);
      touched.insert(where.file);
    }
    for (size_t f : touched) detail::sync_file((staging / layout.files[f].name).string());
  });
  std::vector<std::string> written;
  stages.run("finishing the folder", [&] {
    if (rank == 0) written = finish_folder(staging, target, layout, config, options);
  });
  if (rank != 0) {
    for (const auto& file : layout.files) written.push_back(file.name);
  }
  return written;
}

}  // namespace tdist::models

#include "tdist/checkpoint/sharded_safetensors.h"

#include <cstdio>
#include <filesystem>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "tdist/checkpoint/safetensors_file.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/object_collectives.h"
#include "tdist/error.h"

namespace tdist::checkpoint {

namespace {

namespace fs = std::filesystem;

std::string shard_file(const std::string& base, size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof(name), "-%05zu-of-%05zu.safetensors", index + 1, count);
  return base + name;
}

/// Hugging Face's split: tensors in name order, a new shard whenever the next tensor would
/// take the current one past the limit.
std::vector<TensorMap> split(const TensorMap& tensors, int64_t max_bytes) {
  std::vector<TensorMap> shards(1);
  int64_t bytes = 0;
  for (const auto& [name, t] : tensors) {
    TDIST_CHECK_ARG(t.defined(), "save_safetensors_sharded: tensor '" + name + "' is undefined");
    const int64_t n = static_cast<int64_t>(t.nbytes());
    if (!shards.back().empty() && bytes + n > max_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back()[name] = t;
    bytes += n;
  }
  return shards;
}

/// Every rank must split the same tensors the same way, or shards would be missing.
void check_same_plan_everywhere(const std::vector<TensorMap>& shards) {
  std::string plan;
  for (const auto& shard : shards) {
    for (const auto& [name, t] : shard) plan += name + ":" + std::to_string(t.nbytes()) + ";";
    plan += "|";
  }
  std::vector<Object> all;
  all_gather_object(all, Object(plan));
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].as_string() != plan) {
      TDIST_THROW(InvalidArgument, "save_safetensors_sharded(parallel): rank " + std::to_string(r) +
                                       " holds other tensors than rank " +
                                       std::to_string(get_rank()) +
                                       "; every rank must pass the same full state");
    }
  }
}

}  // namespace

std::vector<std::string> save_safetensors_sharded(const TensorMap& tensors, const std::string& dir,
                                                  const ShardedSafetensorsOptions& options) {
  TDIST_CHECK_ARG(options.max_shard_bytes() > 0,
                  "save_safetensors_sharded: max_shard_bytes must be positive");
  const std::vector<TensorMap> shards = split(tensors, options.max_shard_bytes());
  const bool parallel = options.parallel() && is_initialized() && get_world_size() > 1;
  const int rank = parallel ? get_rank() : 0, world = parallel ? get_world_size() : 1;
  if (parallel) check_same_plan_everywhere(shards);
  fs::create_directories(dir);
  const std::string& base = options.base_name();
  std::vector<std::string> written;
  if (shards.size() == 1) {
    if (rank == 0) {
      written.push_back((fs::path(dir) / (base + ".safetensors")).string());
      save_safetensors(shards[0], written.back());
    }
    if (parallel) barrier();
    return written;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shard_file(base, i, shards.size());
    for (const auto& [name, t] : shards[i]) {
      weight_map[name] = file;
      total += static_cast<int64_t>(t.nbytes());
    }
    if (static_cast<int>(i % world) != rank) continue;
    written.push_back((fs::path(dir) / file).string());
    save_safetensors(shards[i], written.back());
  }
  if (parallel) barrier();  // every shard is on disk before the index names it
  if (rank == 0) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
    written.push_back((fs::path(dir) / (base + ".safetensors.index.json")).string());
    detail::write_file_atomic(written.back(), index.dump(2) + "\n", true);
  }
  if (parallel) barrier();
  return written;
}

// SafetensorsFolder checks the index against its shards (a missing shard, a tensor the index
// places in a file that lacks it, or a shard holding tensors the index does not place there).
TensorMap load_safetensors_sharded(const std::string& dir, const std::string& base_name) {
  const SafetensorsFolder folder(dir, base_name);
  TensorMap out;
  for (const auto& name : folder.names()) {
    const SafetensorsEntry& entry = folder.entry(name);
    at::Tensor t = at::empty(entry.shape, at::TensorOptions().dtype(entry.dtype));
    folder.read_rows(name, 0, t);
    out[name] = std::move(t);
  }
  return out;
}

}  // namespace tdist::checkpoint

#pragma once

// safetensors split in shards as Hugging Face lays them out (save_pretrained): files
// `<base>-00001-of-0000N.safetensors` and an index `<base>.safetensors.index.json`
// ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}); a model that fits one
// shard is the single file `<base>.safetensors`, with no index. Each file is written
// atomically; the index last, so a reader never finds an index naming a missing shard.

#include <cstdint>
#include <string>
#include <vector>

#include "tdist/arg.h"
#include "tdist/checkpoint/interchange.h"

namespace tdist::checkpoint {

struct ShardedSafetensorsOptions {
  /// Largest shard in bytes of tensor data (Hugging Face's default "5GB"); a tensor larger
  /// than this gets a shard of its own.
  TDIST_ARG(int64_t, max_shard_bytes) = int64_t(5) * 1000 * 1000 * 1000;
  /// File name stem: "model" gives model-00001-of-00002.safetensors.
  TDIST_ARG(std::string, base_name) = "model";
  /// Every rank of the default process group holds the same tensors and writes every
  /// world_size-th shard, rank 0 the index; collective. Off: this process writes all.
  TDIST_ARG(bool, parallel) = false;
};

/// Writes `tensors` into `dir` (created); returns the files written, index last.
std::vector<std::string> save_safetensors_sharded(
    const TensorMap& tensors, const std::string& dir,
    const ShardedSafetensorsOptions& options = ShardedSafetensorsOptions());

/// Reads `dir`'s `<base>.safetensors.index.json` and its shards, or its single
/// `<base>.safetensors`; a shard the index names that is missing or holds other tensors
/// than the index says is a CheckpointError naming it.
TensorMap load_safetensors_sharded(const std::string& dir, const std::string& base_name = "model");

}  // namespace tdist::checkpoint

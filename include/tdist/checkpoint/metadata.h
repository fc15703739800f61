#pragma once

// The checkpoint's table of contents. In tdist's own format it is <dir>/metadata.json,
// whose first line "tdist-checkpoint v1 crc32c=<8 hex> bytes=<n>" covers the JSON that
// follows, so a flipped byte in the metadata is caught like one in the data. A PyTorch
// distributed checkpoint's <dir>/.metadata (a pickle) is read into the same description.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tdist/checkpoint/extra_state.h"

namespace tdist::checkpoint {

constexpr const char* kMetadataFile = "metadata.json";
constexpr const char* kDCPMetadataFile = ".metadata";
constexpr int kFormatVersion = 1;

/// How a checkpoint directory lays out its data (docs/checkpoint.md, "Formats").
enum class CheckpointFormat {
  /// metadata.json + shard-<rank>.bin: raw slices, a CRC32C per block. The default.
  kTdist,
  /// PyTorch's torch.distributed.checkpoint (FileSystemWriter's layout): .metadata, a
  /// pickle of its dataclasses, + __<rank>_0.distcp files holding one torch.save per slice.
  /// Python's dcp.load reads it; no checksums beyond the zip CRC of each slice.
  kDCP,
};
std::string to_string(CheckpointFormat format);

/// One saved slice of a tensor: a box of the global tensor, stored contiguously (row-major);
/// in the DCP format the bytes are a torch.save of the slice.
struct ChunkInfo {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  std::string file;
  int64_t byte_offset = 0;
  int64_t byte_length = 0;
};

struct TensorInfo {
  /// safetensors-style dtype name: F32, F64, F16, BF16, I64, I32, I16, I8, U8, BOOL.
  std::string dtype;
  std::vector<int64_t> global_shape;
  std::vector<ChunkInfo> chunks;
};

/// A data file and the CRC32C of each block_bytes-sized block (the last may be shorter),
/// so a reader verifies exactly the blocks it reads.
struct FileInfo {
  int rank = -1;
  int64_t size = 0;
  /// 0: no checksums (the DCP format).
  int64_t block_bytes = 0;
  std::vector<uint32_t> block_crc32c;
};

struct CheckpointMetadata {
  CheckpointFormat format = CheckpointFormat::kTdist;
  int version = kFormatVersion;
  int world_size = 1;
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, FileInfo> files;
  /// One per saving rank.
  std::vector<ExtraState> extra_per_rank;
};

/// Reads and checks <dir>/metadata.json, or a distributed checkpoint's <dir>/.metadata; throws
/// CheckpointError naming the file when it is missing, truncated, fails its checksum, or
/// (.metadata) names anything but the dataclasses of torch.distributed.checkpoint.
CheckpointMetadata read_metadata(const std::string& dir);

}  // namespace tdist::checkpoint

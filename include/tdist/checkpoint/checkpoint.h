#pragma once

// Distributed checkpoints: every rank writes its own slices in parallel; one metadata file
// says where each slice of each tensor lives; a checkpoint saved at world size N loads at
// any world size M into any layout of ShardedTensors (see docs/checkpoint.md).
//
// Layout of a checkpoint directory <dir> (tdist's format; SaveOptions::format can ask for
// PyTorch's distributed checkpoint instead, and load() reads either):
//   metadata.json        table of contents + extra state, checksummed (see metadata.h)
//   shard-00003.bin      the slices rank 3 wrote, each 64 KiB block covered by a CRC32C
// A save writes into <parent>/.<name>.partial-<token>/ and renames it to <dir> only after
// every file is synced and metadata.json is committed; a crash leaves either the previous
// state or a hidden .partial directory, never a visible half checkpoint.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tdist/arg.h"
#include "tdist/checkpoint/coordinator.h"
#include "tdist/checkpoint/extra_state.h"
#include "tdist/checkpoint/metadata.h"
#include "tdist/detail/util/sharded_tensor.h"

namespace tdist::checkpoint {

/// Phases of a save, for fault injection (tests) and error messages.
enum class SavePhase {
  kPlan,         // before the plan is exchanged
  kWrite,        // halfway through writing this rank's data file
  kAfterWrite,   // data written and synced, before reporting success
  kMetadata,     // rank 0: metadata written to its temp file, before the commit rename
  kCommit,       // rank 0: metadata committed, before the directory is renamed into place
  kAfterCommit,  // the directory is in place, before the final agreement
};
std::string to_string(SavePhase phase);

/// Makes rank `rank` fail at `phase`: by throwing (a simulated I/O error, reported to every
/// rank) or by SIGKILL (a crash). Also settable with the environment variable
/// TDIST_CHECKPOINT_FAULT="<rank>:<phase>[:kill]", phase one of plan, write, after_write,
/// metadata, commit, after_commit.
struct FaultInjection {
  int rank = -1;  // -1: no fault
  SavePhase phase = SavePhase::kWrite;
  bool kill = false;
};

struct SaveOptions {
  /// Who to agree with; null: default_coordinator().
  TDIST_ARG(CoordinatorPtr, coordinator) = nullptr;
  /// Replace an existing checkpoint at the same path (the old one stays until the new one is
  /// complete). Without it, saving over an existing checkpoint is an error.
  TDIST_ARG(bool, overwrite) = false;
  /// Granularity of the data checksums; a reader verifies whole blocks.
  TDIST_ARG(int64_t, checksum_block_bytes) = 64 * 1024;
  /// fsync data, metadata and directories (off only for throwaway test data).
  TDIST_ARG(bool, fsync) = true;
  TDIST_ARG(FaultInjection, fault) = FaultInjection{};
  /// kDCP: PyTorch's torch.distributed.checkpoint layout, which Python's dcp.load reads
  /// (checksum_block_bytes then unused: each slice carries its zip CRC). Same atomic commit.
  TDIST_ARG(CheckpointFormat, format) = CheckpointFormat::kTdist;
};

struct LoadOptions {
  TDIST_ARG(CoordinatorPtr, coordinator) = nullptr;
  /// Every requested tensor must be in the checkpoint (else CheckpointError listing them).
  TDIST_ARG(bool, strict) = true;
  /// Verify the checksum of every block read.
  TDIST_ARG(bool, verify) = true;
};

struct LoadResult {
  /// This rank's saved extra state when the world size is unchanged, else rank 0's.
  ExtraState extra;
  int saved_world_size = 0;
  /// Requested but absent (only when strict is off).
  std::vector<std::string> missing_keys;
  /// Saved but not requested.
  std::vector<std::string> unexpected_keys;
  /// Bytes this rank read from data files.
  int64_t bytes_read = 0;
};

/// Collective: every rank of the coordinator calls it with its part of the state. Tensors
/// held by several ranks (identical boxes) are written once, owners chosen round-robin.
/// Throws CheckpointError on every rank if any rank fails, naming the failing ranks.
void save(const ShardedStateDict& state, const ExtraState& extra, const std::string& dir,
          const SaveOptions& options = {});

/// Collective: fills every state[name].local (in place) with its box of the saved tensor,
/// reading only the overlapping bytes. Shapes and dtypes must match the saved ones.
/// On failure every rank throws; the content of `state` is then unspecified.
LoadResult load(ShardedStateDict& state, const std::string& dir, const LoadOptions& options = {});

/// How a directory looks as a checkpoint.
enum class CheckpointStatus { kComplete, kIncomplete, kCorrupt, kMissing };
std::string to_string(CheckpointStatus status);

struct VerifyReport {
  CheckpointStatus status = CheckpointStatus::kMissing;
  /// Why it is not complete (names the file).
  std::string detail;
};

/// Checks a checkpoint without loading it. With read_data, reads every data file and checks
/// every block's checksum; without, checks the metadata and file sizes only. Never throws
/// for a bad checkpoint (reports it).
VerifyReport verify(const std::string& dir, bool read_data = true);

/// True for the hidden directory of a save that never committed.
bool is_partial_dir_name(const std::string& name);

}  // namespace tdist::checkpoint

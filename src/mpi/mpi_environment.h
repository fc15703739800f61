#pragma once

// The MPI backend's environment variables (docs/configuration.md, "MPI backend"), parsed in
// one place, once per MPIBackend: every communicator's choices come from the values its
// backend was created with. They choose a collective's path, so they must match on every
// rank.

#include <cstdint>

namespace tdist::mpi::detail {

struct MPIEnvironment {
  /// TDIST_MPI_SHM: same-host collectives through shared memory (Note [Shared-memory
  /// collectives]).
  bool shared_memory = true;
  /// TDIST_MPI_SHM_MIN_BYTES / _MAX_BYTES: op sizes that take that path (-1 max: no limit).
  int64_t shm_min_bytes = 0;
  int64_t shm_max_bytes = -1;
  /// TDIST_MPI_SHM_PIECE_BYTES: one half of a pipelined piece, rounded up to a multiple of
  /// 4 KiB, at least 4096.
  ///
  /// Note [Piece size]: 256 KiB, because consecutive pieces overlap one rank's copy-in with
  /// another's fold and copy-out while a piece stays in L2: a 1 MiB all_reduce at world 2
  /// took 213-226 us in four pieces against 246-260 us in one, 2 MiB 458-479 against
  /// 505-546 us; single-piece ops, large ops and world 3 did not change (bench/HISTORY.md).
  int64_t piece_bytes = int64_t(256) << 10;
  /// TDIST_MPI_SHM_INLINE: small shared-memory ops may start on the calling thread (Note
  /// [Inline start]).
  bool inline_start = true;
  /// TDIST_MPI_SHM_CMA: plain tensors may be read across processes (Note [Plain tensors read
  /// across processes]).
  bool peer_reads = true;
  /// TDIST_MPI_SHM_CMA_MIN_BYTES / _MAX_BYTES: op sizes whose plain tensors are read across
  /// processes (-1 min: the measured default of each op; -1 max: no limit).
  int64_t peer_read_min_bytes = -1;
  int64_t peer_read_max_bytes = int64_t(16) << 20;
  /// TDIST_MPI_DIRECT_MIN_BYTES: the smallest all_reduce / reduce_scatter / all_gather that
  /// bypasses libnbc on up to 8 ranks (-1: never; Note [Direct collectives]).
  int64_t direct_min_bytes = int64_t(64) << 10;

  /// Unset variables keep the defaults above; a switch that is not 0 or 1, or a size that is
  /// not an integer (at least -1), raises InvalidArgument naming the variable and its value.
  static MPIEnvironment from_env();
};

}  // namespace tdist::mpi::detail

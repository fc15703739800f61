#pragma once

// Note [Shared-memory collectives]: when every rank of a group's communicator is on this node
// (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) has the group's size), all_reduce,
// reduce_scatter_tensor and all_gather_into_tensor move their data through shared memory
// the ranks map, instead of MPI messages: no MPI call, no rendezvous, no message matching,
// and each byte copied once into and once out of the staging area. The ops are the
// same-host engine's (Note [Same-host collectives] in tdist/detail/comm/engine/same_host.h); this
// backend gives it a channel (MPISameHostChannel in the .cpp) over a ShmWindow.
//
// Staging: each rank owns one POSIX shared-memory segment (created and mapped by every peer
// when the backend is built, a collective step, then unlinked so nothing outlives the
// processes; destruction only unmaps, so it never waits for a peer). A segment holds a
// header (two sequence-number flags, `arrived` and `reduced`, each on its own cache lines,
// and two announcement slots) and two halves of TDIST_MPI_SHM_PIECE_BYTES (default 256 KiB)
// each. Ops larger than a half run as consecutive pieces, so the segments never grow
// (growing would be a collective step inside an op); every piece takes the next sequence
// number of the communicator and uses half (seq % 2). half and bfloat16 arrive staged in
// fp32 (mpi_types.h), so they accumulate in fp32; AVG folds as SUM and divides at the end.
//
// Note [Symmetric tensors over MPI shared memory]: when the tensor peers need lives in
// symmetric memory on every rank (tdist/comm/symmetric_memory.h: all_reduce's buffer,
// all_gather's input or output, reduce_scatter's input), an op is one direct step with no
// staging: each rank announces (allocation, offset) in its segment header, peers map that
// allocation (cached, SymmetricMappings) and read straight from it. That halves what a rank
// copies in an all_gather at world 2, and an all_reduce drops the copy-in. Every op, staged
// ones included, announces whether it reads peers directly, so ranks that disagree on the
// path raise DistBackendError at once instead of reading a half nobody wrote.
//
// Note [Plain tensors read across processes]: a tensor in ordinary memory takes the same
// one-step path when the kernel lets the ranks read each other's memory
// (process_vm_readv, "cross-memory attach": same user, no ptrace restriction; probed once per
// window, all ranks agree) and the op's size is in the window where that measured faster
// (TDIST_MPI_SHM_CMA_MIN_BYTES / _MAX_BYTES below): the rank
// announces its tensor's address, and a peer's read is one kernel copy from that address
// into the reader's output (all_gather, all_reduce's last phase) or into a block of scratch
// (the folds). No staging copy: the staged path's copy-in writes lines the peer has just
// read, which on 2 shared cores costs 5-8x a private copy in some minutes
// (bench/HISTORY.md); a kernel read touches the peer's lines only to read them.
// Symmetric and plain tensors then mix freely in one op (each read takes what its owner
// announced).
//
// Flags are written with release and read with acquire atomics. The engine's reuse argument
// needs the pieces of a communicator to run one at a time, in issue order: the executor runs
// a shared-memory op only after every earlier collective of its communicator completed (Note
// [Executor lanes]).
//
// Waiting never blocks for long: a poll spins for at most ~2 us, then returns so the thread
// running it can progress other ops and yield the core (ranks may be oversubscribed; longer
// spins made small ops several times slower on 2 cores). Past the op's timeout it raises
// TimeoutError (as every MPI-backend timeout does) naming the rank that did not arrive.
// Ops up to 4 MiB are started on the calling thread when the communicator is otherwise idle
// (Note [Inline start] in mpi_backend.cpp); the executor finishes them if a peer is late.
//
// Environment (must be the same on every rank):
//   TDIST_MPI_SHM=0                 turns the path off (ops use MPI messages);
//   TDIST_MPI_SHM_MIN_BYTES=<n>     smallest op (bytes of the larger of input/output) on it
//                                   (default 0);
//   TDIST_MPI_SHM_MAX_BYTES=<n>     largest op on it (default -1: no limit);
//   TDIST_MPI_SHM_PIECE_BYTES=<n>   bytes per rank per half (default 256 KiB);
//   TDIST_MPI_SHM_INLINE=0          every op through the executor thread (Note [Inline start]);
//   TDIST_MPI_SHM_CMA=0             plain tensors always staged (Note [Plain tensors read
//                                   across processes]);
//   TDIST_MPI_SHM_CMA_MIN_BYTES=<n> smallest op (as MIN_BYTES) whose plain tensors peers read
//                                   directly (default: 256 KiB, all_reduce 4 MiB);
//   TDIST_MPI_SHM_CMA_MAX_BYTES=<n> largest such op (default 16 MiB; -1: no limit).

#include <mpi.h>
#include <sys/types.h>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mpi/executor.h"
#include "mpi/mpi_environment.h"
#include "tdist/comm/collective_backend.h"
#include "tdist/comm/types.h"
#include "tdist/detail/comm/engine/symmetric_registry.h"

namespace tdist::mpi::detail {

/// The staging segments of one communicator whose ranks all share this node.
class ShmWindow {
 public:
  /// Collective over `comm` (executor thread, same order on every member). Null when the
  /// path is off (env.shared_memory false or size < 2), when some rank is on another node,
  /// or when any rank failed to create or map a segment (all ranks then agree on null).
  static std::shared_ptr<ShmWindow> create(MPI_Comm comm, int rank, int size,
                                           const MPIEnvironment& env);
  ~ShmWindow();
  ShmWindow(const ShmWindow&) = delete;
  ShmWindow& operator=(const ShmWindow&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t piece_bytes() const { return piece_bytes_; }
  /// The values this window's backend was created with.
  const MPIEnvironment& environment() const { return env_; }
  /// Whether an op of `bytes` is in the sizes this path takes (TDIST_MPI_SHM_MIN/MAX_BYTES).
  bool takes(int64_t bytes) const {
    return bytes >= env_.shm_min_bytes && (env_.shm_max_bytes < 0 || bytes <= env_.shm_max_bytes);
  }
  /// Rank r's half for the piece with sequence number `seq`.
  char* half(int r, uint64_t seq) const;
  uint64_t* arrived(int r) const;
  uint64_t* reduced(int r) const;
  /// Rank r's announcement for the piece with sequence number `seq` (Note [Symmetric tensors
  /// over MPI shared memory]): {read directly (0: a staged piece), symmetric allocation id
  /// (0: plain memory), offset in it, address in the owner's process}.
  int64_t* announcement(int r, uint64_t seq) const;
  /// Peers' symmetric allocations this rank has mapped.
  ::tdist::detail::SymmetricMappings& mappings() { return mappings_; }
  /// Whether ranks may read each other's plain memory (Note [Plain tensors read across
  /// processes]); the same answer on every rank.
  bool reads_peer_memory() const { return !pids_.empty(); }
  /// Rank r's process id (valid when reads_peer_memory()).
  pid_t pid(int r) const { return pids_[static_cast<size_t>(r)]; }
  /// The next piece's sequence number (executor thread; the same on every rank).
  uint64_t take_seq() { return next_seq_++; }
  /// Scratch blocks of the direct reductions' folds (kept: ops of one communicator run one
  /// at a time, and a fresh 256 KiB block per op would cost a mapping and its page faults).
  std::vector<char>& fold_scratch(int i) { return fold_scratch_[i]; }

 private:
  ShmWindow(int rank, int size, const MPIEnvironment& env);
  void probe_peer_reads(MPI_Comm comm);

  MPIEnvironment env_;
  int rank_;
  int size_;
  int64_t piece_bytes_;
  size_t segment_bytes_;
  std::vector<char*> segments_;  // every rank's mapping, mine included
  uint64_t next_seq_ = 1;        // flags start at 0
  ::tdist::detail::SymmetricMappings mappings_;
  std::vector<pid_t> pids_;  // every rank's process id; empty: no cross-process reads
  std::vector<char> fold_scratch_[3];
};

/// The op sizes (bytes of the larger of input and output) whose plain tensors peers read
/// across processes (Note [Plain tensors read across processes]):
/// TDIST_MPI_SHM_CMA_MIN_BYTES / _MAX_BYTES, else the measured defaults.
struct PeerReadWindow {
  int64_t min_bytes;
  int64_t max_bytes;  // -1: no limit
  bool contains(int64_t bytes) const {
    return bytes >= min_bytes && (max_bytes < 0 || bytes <= max_bytes);
  }
};
PeerReadWindow peer_read_window(const MPIEnvironment& env, bool all_reduce);

/// True when an op of `bytes` (the larger of input and output) should take the
/// shared-memory path: a window exists, the size is in range, and for reductions the op is
/// one ATen applies (SUM, AVG, PRODUCT, MIN, MAX) on a non-bool dtype.
bool use_shm(const ShmWindow* window, int64_t bytes, at::ScalarType dtype, bool reduces,
             ReduceOp op);

/// What a shared-memory op needs besides its tensors.
struct ShmOpContext {
  std::shared_ptr<ShmWindow> window;
  std::string description;  // "rank 0: all_reduce"
  Executor::Clock::time_point deadline;
  std::chrono::milliseconds timeout;
};

/// `buffer` (contiguous) reduced over all ranks in place. `finally` runs on completion.
StartedOp shm_all_reduce(ShmOpContext ctx, at::Tensor buffer, ReduceOp op,
                         std::function<void()> finally);

/// `out` (contiguous, numel * size == in.numel()) = this rank's chunk of `in` reduced.
StartedOp shm_reduce_scatter(ShmOpContext ctx, at::Tensor in, at::Tensor out, ReduceOp op,
                             std::function<void()> finally);

/// `out` (contiguous, numel == in.numel() * size) = every rank's `in`, in rank order.
StartedOp shm_all_gather(ShmOpContext ctx, at::Tensor in, at::Tensor out,
                         std::function<void()> finally);

/// Note [Placed all-gather] (tdist/detail/comm/placed_all_gather.h): every rank's `in` handed to
/// `place` (once per rank, on the executor thread, before `finally`).
using BlockPlacer = CollectiveBackend::BlockPlacer;
StartedOp shm_all_gather_placed(ShmOpContext ctx, at::Tensor in, BlockPlacer place,
                                std::function<void()> finally);

}  // namespace tdist::mpi::detail

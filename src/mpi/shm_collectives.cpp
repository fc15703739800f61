#include "shm_collectives.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "direct_collectives.h"
#include "tdist/comm/engine/cpu_relax.h"
#include "tdist/comm/engine/reduce_kernels.h"
#include "tdist/comm/engine/shm_object.h"
#include "tdist/error.h"

namespace tdist::mpi::detail {

namespace {

using Clock = Executor::Clock;

// Segment layout: the arrived flag at 0, the reduced flag at 128, the two announcements at
// 256 and 384 (each on its own cache lines, adjacent-line prefetch included), the two halves
// after the first page.
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kReducedOffset = 128;
constexpr size_t kAnnouncementOffset = 256;
// How long one poll spins on a flag before handing the executor back (Note [Shared-memory
// collectives]).
constexpr auto kSpin = std::chrono::microseconds(2);

// What peers read, at window creation, to learn whether cross-process reads work here.
constexpr uint64_t kProbeMagic = 0x74646973'74434d41ull;  // "tdistCMA"
const uint64_t kProbeWord = kProbeMagic;

uint64_t load_acquire(const uint64_t* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
void store_release(uint64_t* p, uint64_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

// A peer's segment, read-write; null unless it has exactly `bytes` (ranks whose
// TDIST_MPI_SHM_PIECE_BYTES differ never share segments: they fall back together).
char* map_peer_segment(const std::string& name, size_t bytes) {
  size_t len = 0;
  char* p = ::tdist::detail::map_shm_object(name, /*writable=*/true, &len);
  if (p != nullptr && len != bytes) {
    munmap(p, len);
    return nullptr;
  }
  return p;
}

}  // namespace

ShmWindow::ShmWindow(int rank, int size, const MPIEnvironment& env)
    : env_(env),
      rank_(rank),
      size_(size),
      piece_bytes_(env.piece_bytes),
      segment_bytes_(kHeaderBytes + 2 * static_cast<size_t>(env.piece_bytes)),
      segments_(size, nullptr) {}

ShmWindow::~ShmWindow() {
  for (char* s : segments_) {
    if (s) munmap(s, segment_bytes_);
  }
}

std::shared_ptr<ShmWindow> ShmWindow::create(MPI_Comm comm, int rank, int size,
                                             const MPIEnvironment& env) {
  if (size < 2 || !env.shared_memory) return nullptr;
  ::tdist::detail::remove_stale_shm_objects();  // segments of jobs that died mid-set-up
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type (shared-memory collectives)");
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  if (node_size != size) return nullptr;  // the same answer on every rank

  char prefix[64] = {};
  if (rank == 0) {
    std::random_device random;
    std::snprintf(prefix, sizeof prefix, "/tdist-mpi-%d-%08x%08x", static_cast<int>(getpid()),
                  random(), random());
  }
  check_mpi(MPI_Bcast(prefix, sizeof prefix, MPI_CHAR, 0, comm),
            "MPI_Bcast (shared-memory segment name)");
  auto name_of = [&](int r) { return std::string(prefix) + "-" + std::to_string(r); };

  std::shared_ptr<ShmWindow> window(new ShmWindow(rank, size, env));
  const std::string mine = name_of(rank);
  std::string error;  // a segment that cannot be had turns the path off on every rank
  window->segments_[rank] = ::tdist::detail::create_shm_object(mine, window->segment_bytes_, error);
  // A fresh tmpfs file reads as zeros: both flags start at 0.
  int ok = window->segments_[rank] != nullptr, all_ok = 0;
  int rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (rc == MPI_SUCCESS && all_ok) {
    // Every segment exists: map the peers'.
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      window->segments_[r] = map_peer_segment(name_of(r), window->segment_bytes_);
      if (!window->segments_[r]) ok = 0;
    }
    rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  }
  // Every peer has mapped it (or given up): the name is no longer needed, and the memory
  // goes away with the last mapping.
  if (window->segments_[rank]) shm_unlink(mine.c_str());
  check_mpi(rc, "MPI_Allreduce (shared-memory collectives set-up)");
  if (!all_ok) return nullptr;
  window->probe_peer_reads(comm);
  return window;
}

// Note [Plain tensors read across processes]: every rank reads a known word from every peer;
// the path is on only if all of them could (a seccomp filter, ptrace_scope or a different
// user makes process_vm_readv fail with EPERM), so all ranks agree.
void ShmWindow::probe_peer_reads(MPI_Comm comm) {
  const int64_t mine[2] = {static_cast<int64_t>(getpid()),
                           static_cast<int64_t>(reinterpret_cast<uintptr_t>(&kProbeWord))};
  std::vector<int64_t> all(2 * static_cast<size_t>(size_));
  check_mpi(MPI_Allgather(mine, 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, comm),
            "MPI_Allgather (shared-memory collectives: process ids)");
  int ok = env_.peer_reads ? 1 : 0;
  for (int r = 0; r < size_ && ok; ++r) {
    if (r == rank_) continue;
    uint64_t word = 0;
    iovec local{&word, sizeof word};
    iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(all[2 * r + 1])), sizeof word};
    const ssize_t got = process_vm_readv(static_cast<pid_t>(all[2 * r]), &local, 1, &remote, 1, 0);
    ok = got == static_cast<ssize_t>(sizeof word) && word == kProbeMagic;
  }
  int all_ok = 0;
  check_mpi(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm),
            "MPI_Allreduce (shared-memory collectives: cross-process reads)");
  if (!all_ok) return;
  for (int r = 0; r < size_; ++r) pids_.push_back(static_cast<pid_t>(all[2 * r]));
}

void read_peer_memory(pid_t pid, int peer, uint64_t remote, void* local, size_t bytes,
                      const std::string& description) {
  char* to = static_cast<char*>(local);
  while (bytes > 0) {
    iovec l{to, bytes};
    iovec r{reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), bytes};
    const ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = got < 0 ? errno : EIO;
      TDIST_THROW(DistBackendError, "mpi: " + description + ": reading rank " +
                                        std::to_string(peer) + "'s tensor (process " +
                                        std::to_string(pid) + ") failed: " + std::strerror(err) +
                                        " (did that rank exit or free the tensor mid-op?)");
    }
    to += got;
    remote += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
}

char* ShmWindow::half(int r, uint64_t seq) const {
  return segments_[r] + kHeaderBytes + (seq & 1) * piece_bytes_;
}

uint64_t* ShmWindow::arrived(int r) const {
  return reinterpret_cast<uint64_t*>(segments_[r]);
}

uint64_t* ShmWindow::reduced(int r) const {
  return reinterpret_cast<uint64_t*>(segments_[r] + kReducedOffset);
}

int64_t* ShmWindow::announcement(int r, uint64_t seq) const {
  return reinterpret_cast<int64_t*>(segments_[r] + kAnnouncementOffset + (seq & 1) * 128);
}

// Note [Plain tensors read across processes]: measured on 2 cores (bench/HISTORY.md), all_gather
// and reduce_scatter gain from 256 KiB, all_reduce (two reads of peer memory, three hand-offs) only
// from 4 MiB; above 16 MiB the staged pipeline is faster.
PeerReadWindow peer_read_window(const MPIEnvironment& env, bool all_reduce) {
  const int64_t fallback_min = all_reduce ? int64_t(4) << 20 : int64_t(256) << 10;
  return {env.peer_read_min_bytes >= 0 ? env.peer_read_min_bytes : fallback_min,
          env.peer_read_max_bytes};
}

bool use_shm(const ShmWindow* window, int64_t bytes, at::ScalarType dtype, bool reduces,
             ReduceOp op) {
  if (!window) return false;
  if (!window->takes(bytes)) return false;
  if (!reduces) return true;
  return reduce_out_supports(dtype, op);
}

namespace {

enum class Kind { kAllReduce, kReduceScatter, kAllGather };

// One shared-memory op: a sequence of pieces, each a small state machine driven by poll().
// all_reduce pieces cover elements [begin, begin + len) of the buffer; reduce_scatter pieces
// the same range of every rank's chunk (domain = output numel); all_gather pieces a range
// of the input (domain = input numel).
class ShmOp {
 public:
  ShmOp(ShmOpContext ctx, Kind kind, at::Tensor in, at::Tensor out, ReduceOp op,
        BlockPlacer place = nullptr)
      : ctx_(std::move(ctx)),
        w_(*ctx_.window),
        kind_(kind),
        in_(std::move(in)),
        out_(std::move(out)),
        op_(op),
        raw_fold_(::tdist::detail::raw_reduce_fn(op, in_.scalar_type())),
        es_(in_.element_size()),
        place_(std::move(place)) {
    const int n = w_.size();
    domain_ = kind_ == Kind::kReduceScatter ? out_.numel() : in_.numel();
    const int64_t per_piece = kind_ == Kind::kReduceScatter ? n * es_ : es_;
    piece_elems_ = std::max<int64_t>(1, w_.piece_bytes() / per_piece);
    if (domain_ == 0) return;  // (placed: every empty block at the end of poll)
    // Peers read my input (all_gather: where they can; it is usually not freshly written,
    // and moving lines another core just wrote is what costs most between cores). Else, for
    // all_gather, my block of the output when only it is symmetric, filled before I announce
    // it. Plain tensors: peers read my input across processes when they may (Note [Plain
    // tensors read across processes]); the choice depends only on what every rank shares.
    shared_bytes_ = in_.nbytes();
    sym_ = ::tdist::detail::find_symmetric(in_.data_ptr(), shared_bytes_);
    if (kind_ == Kind::kAllGather && sym_.id == 0 && !place_) {
      const ::tdist::detail::SymmetricRef block =
          ::tdist::detail::find_symmetric(out_at(w_.rank() * domain_), shared_bytes_);
      if (block.id != 0) {
        announce_output_ = true;
        sym_ = block;
      }
    }
    // (A placed all-gather's size is its peers' output size, so every rank picks one path.)
    const int64_t op_bytes = place_ ? static_cast<int64_t>(in_.nbytes()) * n
                                    : std::max<int64_t>(in_.nbytes(), out_.nbytes());
    const PeerReadWindow plain = peer_read_window(w_.environment(), kind_ == Kind::kAllReduce);
    direct_ = sym_.id != 0 || (w_.reads_peer_memory() && plain.contains(op_bytes));
    // Note [Placed all-gather over shared memory]: one step hands each peer's block to the
    // placer where it lives (mapped) or as read from its process; staged pieces gather
    // rank-major into a scratch buffer first, placed from there once complete.
    if (place_ && !direct_) out_ = at::empty({n * domain_}, in_.options());
  }

  // One call runs stages until the op is finished (true) or waits on a peer (false).
  bool poll(bool& progressed) {
    while (true) {
      switch (step(progressed)) {
        case Step::kBlocked:
          return false;
        case Step::kFinished:
          return true;
        case Step::kNext:
          break;
      }
    }
  }

 private:
  enum class Stage { kBegin, kArrived, kReduced, kDirectArrived, kDirectDone, kDirectFinal };

  enum class Step { kNext, kBlocked, kFinished };

  // Staged pieces: kBegin -> kArrived (-> kReduced for all_reduce) -> kBegin, per piece.
  // Direct (peers read each other's tensors): kBegin -> kDirectArrived -> kDirectDone
  // (-> kDirectFinal for all_reduce), once for the whole op.
  Step step(bool& progressed) {
    switch (stage_) {
      case Stage::kBegin:
        return begin_next(progressed);
      case Stage::kArrived:
        return consume_arrived(progressed);
      case Stage::kReduced:
        return copy_out_reduced(progressed);
      case Stage::kDirectArrived:
        return read_announced(progressed);
      case Stage::kDirectDone:
        return finish_direct_reads(progressed);
      case Stage::kDirectFinal:
        return await_reduced_copies();
    }
    return Step::kNext;
  }

  Step begin_next(bool& progressed) {
    if (begin_ >= domain_) {
      if (place_ && !direct_) place_every_block();
      return Step::kFinished;
    }
    if (direct_) {
      begin_direct();
      stage_ = Stage::kDirectArrived;
    } else {
      begin_piece();
      stage_ = Stage::kArrived;
    }
    progressed = true;
    k_ = 0;
    return Step::kNext;
  }

  // Every rank's part of this piece is in its half: fold or copy it.
  Step consume_arrived(bool& progressed) {
    const int n = w_.size(), r = w_.rank();
    for (; k_ < n; ++k_) {
      if (k_ != r && !wait_for(w_.arrived(k_), k_, "copied its input in")) return Step::kBlocked;
      if (k_ != r) check_same_path(k_);
      consume(k_);
      progressed = true;
    }
    if (kind_ == Kind::kAllReduce) {
      store_release(w_.reduced(r), seq_);
      stage_ = Stage::kReduced;
      k_ = 0;
    } else {
      begin_ += len_;
      stage_ = Stage::kBegin;
    }
    return Step::kNext;
  }

  // all_reduce: every rank has published its reduced chunk of this piece: copy them out.
  Step copy_out_reduced(bool& progressed) {
    const int n = w_.size(), r = w_.rank();
    for (; k_ < n; ++k_) {
      if (k_ != r && !wait_for(w_.reduced(k_), k_, "published its reduced chunk")) {
        return Step::kBlocked;
      }
      std::memcpy(in_at(begin_ + chunk_begin(k_)), w_.half(k_, seq_) + chunk_begin(k_) * es_,
                  chunk_len(k_) * es_);
      progressed = true;
    }
    begin_ += len_;
    stage_ = Stage::kBegin;
    return Step::kNext;
  }

  // Direct: every rank has announced its tensor; gather from them, then fold my chunk.
  Step read_announced(bool& progressed) {
    const int n = w_.size(), r = w_.rank();
    for (; k_ < n; ++k_) {
      if (k_ != r && !wait_for(w_.arrived(k_), k_, "announced its tensor")) return Step::kBlocked;
      if (k_ != r) check_same_path(k_);
      if (kind_ == Kind::kAllGather && k_ != r) {
        if (place_) {
          place_from(k_);
        } else {
          copy_from(k_, 0, out_at(k_ * domain_), domain_ * es_);
        }
      }
      progressed = true;
    }
    if (kind_ == Kind::kAllReduce) {
      fold_ranks(chunk_begin(r), chunk_len(r), in_at(chunk_begin(r)));
    } else if (kind_ == Kind::kReduceScatter) {
      fold_ranks(r * domain_, domain_, out_at(0));
    }
    store_release(w_.reduced(r), seq_);
    stage_ = Stage::kDirectDone;
    k_ = 0;
    return Step::kNext;
  }

  // Direct: every rank has finished reading; all_reduce copies the peers' reduced chunks.
  Step finish_direct_reads(bool& progressed) {
    const int n = w_.size(), r = w_.rank();
    for (; k_ < n; ++k_) {
      if (k_ != r && !wait_for(w_.reduced(k_), k_, "finished reading")) return Step::kBlocked;
      if (kind_ == Kind::kAllReduce && k_ != r) {
        // Rank k's chunk is reduced, and rank k no longer reads mine.
        copy_from(k_, chunk_begin(k_) * es_, in_at(chunk_begin(k_)), chunk_len(k_) * es_);
        progressed = true;
      }
    }
    if (kind_ == Kind::kAllReduce) {
      // Peers copy my reduced chunk out of my tensor: return only once they are done.
      store_release(w_.arrived(r), done_seq_);
      stage_ = Stage::kDirectFinal;
      k_ = 0;
      return Step::kNext;
    }
    begin_ = domain_;
    stage_ = Stage::kBegin;
    return Step::kNext;
  }

  // Direct all_reduce: every peer has copied my reduced chunk out of my tensor.
  Step await_reduced_copies() {
    const int n = w_.size(), r = w_.rank();
    for (; k_ < n; ++k_) {
      if (k_ != r && !wait_for(w_.arrived(k_), k_, "copied the reduced chunks", done_seq_)) {
        return Step::kBlocked;
      }
    }
    begin_ = domain_;
    stage_ = Stage::kBegin;
    return Step::kNext;
  }

  // all_reduce: chunk j of the current piece is [chunk_begin(j), chunk_begin(j + 1)).
  int64_t chunk_begin(int j) const { return len_ * j / w_.size(); }
  int64_t chunk_len(int j) const { return chunk_begin(j + 1) - chunk_begin(j); }
  char* in_at(int64_t element) const { return static_cast<char*>(in_.data_ptr()) + element * es_; }
  char* out_at(int64_t element) const {
    return static_cast<char*>(out_.data_ptr()) + element * es_;
  }
  at::Tensor view(char* p, int64_t numel) const { return at::from_blob(p, {numel}, in_.options()); }

  void begin_piece() {
    const int n = w_.size(), r = w_.rank();
    len_ = std::min(piece_elems_, domain_ - begin_);
    seq_ = w_.take_seq();
    char* mine = w_.half(r, seq_);
    switch (kind_) {
      case Kind::kAllReduce:
        for (int j = 0; j < n; ++j) {
          if (j == r) continue;
          std::memcpy(mine + chunk_begin(j) * es_, in_at(begin_ + chunk_begin(j)),
                      chunk_len(j) * es_);
        }
        break;
      case Kind::kReduceScatter:
        for (int j = 0; j < n; ++j) {
          if (j == r) continue;
          std::memcpy(mine + j * len_ * es_, in_at(j * domain_ + begin_), len_ * es_);
        }
        break;
      case Kind::kAllGather:
        std::memcpy(mine, in_at(begin_), len_ * es_);
        break;
    }
    announce();
    store_release(w_.arrived(r), seq_);
    if (kind_ == Kind::kAllGather) {
      // My own part, while the peers copy theirs in.
      std::memcpy(out_at(r * domain_ + begin_), in_at(begin_), len_ * es_);
    }
  }

  // My announcement for this piece (ShmWindow::announcement's layout).
  void announce() {
    int64_t* slot = w_.announcement(w_.rank(), seq_);
    slot[0] = direct_ ? 1 : 0;
    slot[1] = static_cast<int64_t>(sym_.id);
    slot[2] = sym_.offset;
    slot[3] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(
        announce_output_ ? out_at(w_.rank() * domain_) : in_.data_ptr()));
  }

  // Rank k (arrived at this piece) took the same path as this rank, or both raise. Ranks
  // disagree only when symmetric memory is on some ranks and plain tensors cannot be read
  // across processes (or the op is outside their size window).
  void check_same_path(int k) const {
    const bool theirs = w_.announcement(k, seq_)[0] != 0;
    const bool mine = direct_;
    if (theirs == mine) return;
    TDIST_THROW(DistBackendError, "mpi: " + ctx_.description + ": rank " +
                                      std::to_string(mine ? w_.rank() : k) +
                                      " passed a tensor in symmetric memory and rank " +
                                      std::to_string(mine ? k : w_.rank()) +
                                      " did not: pass contiguous symmetric-memory tensors "
                                      "(tdist::symmetric_memory::empty) on every rank, or on none");
  }

  // The whole op as one piece (Note [Symmetric tensors over MPI shared memory]).
  void begin_direct() {
    const int r = w_.rank();
    len_ = domain_;
    seq_ = w_.take_seq();
    // all_reduce has a third phase, flagged on `arrived` with a sequence number of its own.
    if (kind_ == Kind::kAllReduce) done_seq_ = w_.take_seq();
    if (kind_ == Kind::kAllGather && place_) {
      announce();
      store_release(w_.arrived(r), seq_);
      place_(r, in_at(0));  // while the peers read mine
      return;
    }
    const bool own_copy = kind_ == Kind::kAllGather && out_at(r * domain_) != in_at(0);
    if (own_copy && announce_output_) std::memcpy(out_at(r * domain_), in_at(0), domain_ * es_);
    announce();
    store_release(w_.arrived(r), seq_);
    if (own_copy && !announce_output_) std::memcpy(out_at(r * domain_), in_at(0), domain_ * es_);
  }

  // Rank k's whole block (one step) to the placer: from its mapping, or read from its process.
  void place_from(int k) { place_(k, bytes_of(k, 0, domain_ * es_, w_.fold_scratch(1))); }

  // Every rank's block to the placer, once the op is complete: rank-major from `out_`
  // (staged), or my own input for every rank when the blocks are empty.
  void place_every_block() {
    for (int c = 0; c < w_.size(); ++c) place_(c, domain_ == 0 ? in_at(0) : out_at(c * domain_));
  }

  // Bytes [offset, offset + bytes) of what rank k != me announced (all_gather: its block;
  // reductions: its whole tensor), copied into `dst`: from its mapped symmetric allocation,
  // or read from its process.
  void copy_from(int k, int64_t offset, char* dst, int64_t bytes) {
    if (bytes == 0) return;
    const int64_t* slot = w_.announcement(k, seq_);
    if (slot[1] != 0) {
      std::memcpy(dst, mapped(k, slot) + offset, static_cast<size_t>(bytes));
      return;
    }
    read_peer_memory(w_.pid(k), k, static_cast<uint64_t>(slot[3] + offset), dst,
                     static_cast<size_t>(bytes), ctx_.description);
  }

  // The same bytes of any rank's tensor (mine included) as a pointer: in place when they are
  // mine or mapped, else read into `scratch`.
  const char* bytes_of(int k, int64_t offset, int64_t bytes, std::vector<char>& scratch) {
    if (k == w_.rank()) return static_cast<const char*>(in_.data_ptr()) + offset;
    const int64_t* slot = w_.announcement(k, seq_);
    if (slot[1] != 0) return mapped(k, slot) + offset;
    if (scratch.size() < static_cast<size_t>(bytes)) scratch.resize(static_cast<size_t>(bytes));
    copy_from(k, offset, scratch.data(), bytes);
    return scratch.data();
  }

  const char* mapped(int k, const int64_t* slot) {
    return w_.mappings().map(static_cast<uint64_t>(slot[1]), slot[2], shared_bytes_, w_.rank(), k);
  }

  // dst[0, count) = elements [first, first + count) of every rank's tensor folded in rank
  // order, block by block (256 KiB: few kernel calls for reads across processes, and the
  // blocks stay in L2). Steps before the last accumulate in scratch; the last writes dst,
  // which may be this rank's own input there (all_reduce's chunk): by then every other
  // contribution to the block has been read, and an elementwise op may write the very
  // elements it reads.
  void fold_ranks(int64_t first, int64_t count, char* dst) {
    constexpr int64_t kBlockBytes = int64_t(256) << 10;
    const int n = w_.size();
    const int64_t per_block = std::max<int64_t>(1, kBlockBytes / es_);
    // The fold so far (world > 2); rank 0's block, read from its process (in use until rank
    // 1's arrives); another rank's block, read from its process.
    std::vector<char>& acc = w_.fold_scratch(0);
    std::vector<char>& first_read = w_.fold_scratch(1);
    std::vector<char>& next_read = w_.fold_scratch(2);
    for (int64_t done = 0; done < count; done += per_block) {
      const int64_t k = std::min(per_block, count - done);
      const int64_t at = (first + done) * es_, bytes = k * es_;
      const char* first_rank = bytes_of(0, at, bytes, first_read);
      if (n > 2 && acc.size() < static_cast<size_t>(bytes)) acc.resize(static_cast<size_t>(bytes));
      for (int p = 1; p < n; ++p) {
        char* out = p == n - 1 ? dst + done * es_ : acc.data();
        const char* so_far = p == 1 ? first_rank : acc.data();
        fold_bytes(out, so_far, bytes_of(p, at, bytes, next_read), k);
      }
    }
  }

  // Takes rank k's contribution to the current piece (k's input has arrived).
  void consume(int k) {
    const int r = w_.rank();
    switch (kind_) {
      case Kind::kAllGather:
        if (k != r) std::memcpy(out_at(k * domain_ + begin_), w_.half(k, seq_), len_ * es_);
        return;
      case Kind::kAllReduce: {
        // My chunk accumulates in my own chunk's slot of my half (the copy-in skipped it).
        const int64_t off = chunk_begin(r), count = chunk_len(r);
        if (count == 0) return;
        fold(w_.half(r, seq_) + off * es_, k,
             k == r ? in_at(begin_ + off) : w_.half(k, seq_) + off * es_, count);
        return;
      }
      case Kind::kReduceScatter: {
        if (len_ == 0) return;
        fold(out_at(begin_), k,
             k == r ? in_at(r * domain_ + begin_) : w_.half(k, seq_) + r * len_ * es_, len_);
        return;
      }
    }
  }

  // acc = c_0 (op) c_1 (op) ... in rank order; called with k = 0, 1, ... in turn.
  void fold(char* acc, int k, char* contribution, int64_t count) {
    if (k == 0) {
      first_ = contribution;
      return;
    }
    fold_bytes(acc, k == 1 ? first_ : acc, contribution, count);
  }

  // out = a (op) b over `count` elements: the comm layer's plain loops where there is one
  // (Note [Raw reduce kernels]), else ATen.
  void fold_bytes(char* out, const char* a, const char* b, int64_t count) const {
    if (count == 0) return;
    if (raw_fold_ != nullptr) {
      raw_fold_(out, a, b, static_cast<size_t>(count));
      return;
    }
    at::Tensor o = view(out, count);
    reduce_out(o, view(const_cast<char*>(a), count), view(const_cast<char*>(b), count), op_);
  }

  // True once *flag >= seq_; false after spinning kSpin (poll again later). Throws past the
  // op's deadline, naming the rank that did not arrive.
  bool wait_for(const uint64_t* flag, int peer, const char* what) {
    return wait_for(flag, peer, what, seq_);
  }
  bool wait_for(const uint64_t* flag, int peer, const char* what, uint64_t seq) {
    if (load_acquire(flag) >= seq) return true;
    const auto start = Clock::now();
    while (true) {
      for (int i = 0; i < 64; ++i) {
        ::tdist::detail::cpu_relax();
        if (load_acquire(flag) >= seq) return true;
      }
      const auto now = Clock::now();
      if (now > ctx_.deadline) {
        TDIST_THROW(TimeoutError,
                    "mpi: " + ctx_.description + " over shared memory (piece #" +
                        std::to_string(seq_) + ") did not complete within " +
                        std::to_string(ctx_.timeout.count()) + " ms: rank " + std::to_string(peer) +
                        " has not " + what +
                        " (it is slow, stopped, or issued a different collective; every rank "
                        "must issue the same collectives in the same order)");
      }
      if (now - start > kSpin) return false;
    }
  }

  ShmOpContext ctx_;
  ShmWindow& w_;
  Kind kind_;
  at::Tensor in_, out_;
  ReduceOp op_;
  ::tdist::detail::RawReduceFn raw_fold_;  // null: ATen folds (Note [Raw reduce kernels])
  int64_t es_;
  int64_t domain_ = 0;
  int64_t piece_elems_ = 1;
  int64_t begin_ = 0;  // the current piece: [begin_, begin_ + len_) of the domain
  int64_t len_ = 0;
  uint64_t seq_ = 0;
  Stage stage_ = Stage::kBegin;
  int k_ = 0;                          // the next rank (in rank order) of the current stage
  char* first_ = nullptr;              // rank 0's contribution, until rank 1's arrives
  ::tdist::detail::SymmetricRef sym_;  // my symmetric tensor (id 0: none)
  bool direct_ = false;                // one step, peers read my tensor (else staged pieces)
  size_t shared_bytes_ = 0;
  bool announce_output_ = false;  // symmetric all_gather: peers read my output block, not my input
  uint64_t done_seq_ = 0;         // symmetric all_reduce: its last phase's number
  BlockPlacer place_;             // all_gather_placed: where each rank's block goes (else out_)
};

StartedOp started(std::shared_ptr<ShmOp> op, std::function<void()> finally) {
  StartedOp s;
  s.poll = [op](bool& progressed) { return op->poll(progressed); };
  s.on_complete = [op, finally = std::move(finally)] {
    if (finally) finally();
  };
  return s;
}

}  // namespace

StartedOp shm_all_reduce(ShmOpContext ctx, at::Tensor buffer, ReduceOp op,
                         std::function<void()> finally) {
  at::Tensor flat = buffer.view({-1});
  return started(std::make_shared<ShmOp>(std::move(ctx), Kind::kAllReduce, flat, flat, op),
                 std::move(finally));
}

StartedOp shm_reduce_scatter(ShmOpContext ctx, at::Tensor in, at::Tensor out, ReduceOp op,
                             std::function<void()> finally) {
  return started(std::make_shared<ShmOp>(std::move(ctx), Kind::kReduceScatter, in.view({-1}),
                                         out.view({-1}), op),
                 std::move(finally));
}

StartedOp shm_all_gather(ShmOpContext ctx, at::Tensor in, at::Tensor out,
                         std::function<void()> finally) {
  return started(std::make_shared<ShmOp>(std::move(ctx), Kind::kAllGather, in.view({-1}),
                                         out.view({-1}), ReduceOp::SUM),
                 std::move(finally));
}

StartedOp shm_all_gather_placed(ShmOpContext ctx, at::Tensor in, BlockPlacer place,
                                std::function<void()> finally) {
  return started(std::make_shared<ShmOp>(std::move(ctx), Kind::kAllGather, in.view({-1}),
                                         at::Tensor(), ReduceOp::SUM, std::move(place)),
                 std::move(finally));
}

}  // namespace tdist::mpi::detail

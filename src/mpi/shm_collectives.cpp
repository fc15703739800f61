#include "shm_collectives.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "direct_collectives.h"
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
constexpr int64_t kDefaultPieceBytes = int64_t(1) << 20;
// How long one poll spins on a flag before handing the executor back (Note [Shared-memory
// collectives]).
constexpr auto kSpin = std::chrono::microseconds(2);

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : fallback;
}

bool shm_enabled() {
  const char* v = std::getenv("TDIST_MPI_SHM");
  return !v || std::string(v) != "0";
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

uint64_t load_acquire(const uint64_t* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
void store_release(uint64_t* p, uint64_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

char* map_segment(const std::string& name, size_t bytes, bool create) {
  const int fd = create ? shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)
                        : shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return nullptr;
  void* p = MAP_FAILED;
  if (!create || ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

}  // namespace

ShmWindow::ShmWindow(int rank, int size, int64_t piece_bytes)
    : rank_(rank),
      size_(size),
      piece_bytes_(piece_bytes),
      segment_bytes_(kHeaderBytes + 2 * static_cast<size_t>(piece_bytes)),
      segments_(size, nullptr) {}

ShmWindow::~ShmWindow() {
  for (char* s : segments_) {
    if (s) munmap(s, segment_bytes_);
  }
}

std::shared_ptr<ShmWindow> ShmWindow::create(MPI_Comm comm, int rank, int size) {
  if (size < 2 || !shm_enabled()) return nullptr;
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type (shared-memory collectives)");
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  if (node_size != size) return nullptr;  // the same answer on every rank

  // Halves are multiples of 4 KiB, so every element type stays aligned.
  const int64_t piece =
      (std::max<int64_t>(env_int("TDIST_MPI_SHM_PIECE_BYTES", kDefaultPieceBytes), 4096) + 4095) /
      4096 * 4096;
  char prefix[64] = {};
  if (rank == 0) {
    std::random_device random;
    std::snprintf(prefix, sizeof prefix, "/tdist-mpi-%d-%08x%08x", static_cast<int>(getpid()),
                  random(), random());
  }
  check_mpi(MPI_Bcast(prefix, sizeof prefix, MPI_CHAR, 0, comm),
            "MPI_Bcast (shared-memory segment name)");
  auto name_of = [&](int r) { return std::string(prefix) + "-" + std::to_string(r); };

  std::shared_ptr<ShmWindow> window(new ShmWindow(rank, size, piece));
  const std::string mine = name_of(rank);
  window->segments_[rank] = map_segment(mine, window->segment_bytes_, /*create=*/true);
  // A fresh tmpfs file reads as zeros: both flags start at 0.
  int ok = window->segments_[rank] != nullptr, all_ok = 0;
  int rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (rc == MPI_SUCCESS && all_ok) {
    // Every segment exists: map the peers'.
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      window->segments_[r] = map_segment(name_of(r), window->segment_bytes_, /*create=*/false);
      if (!window->segments_[r]) ok = 0;
    }
    rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  }
  // Every peer has mapped it (or given up): the name is no longer needed, and the memory
  // goes away with the last mapping.
  if (window->segments_[rank]) shm_unlink(mine.c_str());
  check_mpi(rc, "MPI_Allreduce (shared-memory collectives set-up)");
  if (!all_ok) return nullptr;
  return window;
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

bool use_shm(const ShmWindow* window, int64_t bytes, at::ScalarType dtype, bool reduces,
             ReduceOp op) {
  if (!window) return false;
  static const int64_t min_bytes = env_int("TDIST_MPI_SHM_MIN_BYTES", 0);
  static const int64_t max_bytes = env_int("TDIST_MPI_SHM_MAX_BYTES", -1);
  if (bytes < min_bytes || (max_bytes >= 0 && bytes > max_bytes)) return false;
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
  ShmOp(ShmOpContext ctx, Kind kind, at::Tensor in, at::Tensor out, ReduceOp op)
      : ctx_(std::move(ctx)),
        w_(*ctx_.window),
        kind_(kind),
        in_(std::move(in)),
        out_(std::move(out)),
        op_(op),
        es_(in_.element_size()) {
    const int n = w_.size();
    domain_ = kind_ == Kind::kReduceScatter ? out_.numel() : in_.numel();
    const int64_t per_piece = kind_ == Kind::kReduceScatter ? n * es_ : es_;
    piece_elems_ = std::max<int64_t>(1, w_.piece_bytes() / per_piece);
    if (domain_ == 0) return;
    // Peers read my input (all_gather: where they can; it is usually not freshly written,
    // and moving lines another core just wrote is what costs most between cores). Else, for
    // all_gather, my block of the output, filled before I announce it.
    shared_bytes_ = in_.nbytes();
    sym_ = ::tdist::detail::find_symmetric(in_.data_ptr(), shared_bytes_);
    if (kind_ == Kind::kAllGather && sym_.id == 0) {
      announce_output_ = true;
      sym_ = ::tdist::detail::find_symmetric(out_at(w_.rank() * domain_), shared_bytes_);
    }
  }

  bool poll(bool& progressed) {
    const int n = w_.size(), r = w_.rank();
    while (true) {
      switch (stage_) {
        case Stage::kBegin:
          if (begin_ >= domain_) return true;
          if (sym_.id != 0) {
            begin_symmetric();
            progressed = true;
            stage_ = Stage::kSymArrived;
            k_ = 0;
            break;
          }
          begin_piece();
          progressed = true;
          stage_ = Stage::kArrived;
          k_ = 0;
          break;
        case Stage::kArrived:
          for (; k_ < n; ++k_) {
            if (k_ != r && !wait_for(w_.arrived(k_), k_, "copied its input in")) return false;
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
          break;
        case Stage::kReduced:
          for (; k_ < n; ++k_) {
            if (k_ != r && !wait_for(w_.reduced(k_), k_, "published its reduced chunk")) {
              return false;
            }
            std::memcpy(in_at(begin_ + chunk_begin(k_)), w_.half(k_, seq_) + chunk_begin(k_) * es_,
                        chunk_len(k_) * es_);
            progressed = true;
          }
          begin_ += len_;
          stage_ = Stage::kBegin;
          break;
        case Stage::kSymArrived:
          for (; k_ < n; ++k_) {
            if (k_ != r && !wait_for(w_.arrived(k_), k_, "announced its tensor")) return false;
            if (k_ != r) check_same_path(k_);
            if (kind_ != Kind::kAllReduce) consume_symmetric(k_);
            progressed = true;
          }
          if (kind_ == Kind::kAllReduce) reduce_my_chunk_symmetric();
          store_release(w_.reduced(r), seq_);
          stage_ = Stage::kSymDone;
          k_ = 0;
          break;
        case Stage::kSymDone:
          for (; k_ < n; ++k_) {
            if (k_ != r && !wait_for(w_.reduced(k_), k_, "finished reading")) return false;
            if (kind_ == Kind::kAllReduce && k_ != r) {
              // Rank k's chunk is reduced, and rank k no longer reads mine.
              std::memcpy(in_at(chunk_begin(k_)), shared_of(k_) + chunk_begin(k_) * es_,
                          chunk_len(k_) * es_);
              progressed = true;
            }
          }
          if (kind_ == Kind::kAllReduce) {
            // Peers copy my reduced chunk out of my tensor: return only once they are done.
            store_release(w_.arrived(r), done_seq_);
            stage_ = Stage::kSymFinal;
            k_ = 0;
            break;
          }
          begin_ = domain_;
          stage_ = Stage::kBegin;
          break;
        case Stage::kSymFinal:
          for (; k_ < n; ++k_) {
            if (k_ != r && !wait_for(w_.arrived(k_), k_, "copied the reduced chunks", done_seq_)) {
              return false;
            }
          }
          begin_ = domain_;
          stage_ = Stage::kBegin;
          break;
      }
    }
  }

 private:
  enum class Stage { kBegin, kArrived, kReduced, kSymArrived, kSymDone, kSymFinal };

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
    announce(0, 0);
    store_release(w_.arrived(r), seq_);
    if (kind_ == Kind::kAllGather) {
      // My own part, while the peers copy theirs in.
      std::memcpy(out_at(r * domain_ + begin_), in_at(begin_), len_ * es_);
    }
  }

  void announce(uint64_t id, int64_t offset) {
    int64_t* slot = w_.announcement(w_.rank(), seq_);
    slot[0] = static_cast<int64_t>(id);
    slot[1] = offset;
  }

  // Rank k (arrived at this piece) took the same path as this rank, or both raise.
  void check_same_path(int k) const {
    const bool theirs = w_.announcement(k, seq_)[0] != 0;
    const bool mine = sym_.id != 0;
    if (theirs == mine) return;
    TDIST_THROW(DistBackendError, "mpi: " + ctx_.description + ": rank " +
                                      std::to_string(mine ? w_.rank() : k) +
                                      " passed a tensor in symmetric memory and rank " +
                                      std::to_string(mine ? k : w_.rank()) +
                                      " did not: pass contiguous symmetric-memory tensors "
                                      "(tdist::symmetric_memory::empty) on every rank, or on none");
  }

  // The whole op as one piece (Note [Symmetric tensors over MPI shared memory]).
  void begin_symmetric() {
    const int r = w_.rank();
    len_ = domain_;
    seq_ = w_.take_seq();
    // all_reduce has a third phase, flagged on `arrived` with a sequence number of its own.
    if (kind_ == Kind::kAllReduce) done_seq_ = w_.take_seq();
    const bool own_copy = kind_ == Kind::kAllGather && out_at(r * domain_) != in_at(0);
    if (own_copy && announce_output_) std::memcpy(out_at(r * domain_), in_at(0), domain_ * es_);
    announce(sym_.id, sym_.offset);
    store_release(w_.arrived(r), seq_);
    if (own_copy && !announce_output_) std::memcpy(out_at(r * domain_), in_at(0), domain_ * es_);
  }

  // What rank k announced, mapped (reductions: rank k's whole tensor, mine for k == r;
  // all_gather: rank k's block, k != r).
  const char* shared_of(int k) {
    if (k == w_.rank()) return static_cast<const char*>(in_.data_ptr());
    const int64_t* slot = w_.announcement(k, seq_);
    return w_.mappings().map(static_cast<uint64_t>(slot[0]), slot[1], shared_bytes_, w_.rank(), k);
  }

  // all_reduce: chunk r of every rank's tensor, folded in rank order (in cache-sized blocks
  // through a scratch block: my own chunk is one of the inputs), into my chunk r.
  void reduce_my_chunk_symmetric() {
    const int n = w_.size(), r = w_.rank();
    const int64_t begin = chunk_begin(r), count = chunk_len(r);
    constexpr int64_t kBlockBytes = int64_t(64) << 10;
    const int64_t per_block = std::max<int64_t>(1, kBlockBytes / es_);
    if (scratch_.size() < static_cast<size_t>(std::min(count, per_block) * es_)) {
      scratch_.resize(std::min(count, per_block) * es_);
    }
    for (int64_t done = 0; done < count; done += per_block) {
      const int64_t k = std::min(per_block, count - done);
      const int64_t at = (begin + done) * es_;
      at::Tensor acc = view(scratch_.data(), k);
      for (int p = 0; p < n; ++p) fold(acc, p, const_cast<char*>(shared_of(p)) + at, k);
      std::memcpy(in_at(begin + done), scratch_.data(), k * es_);
    }
  }

  void consume_symmetric(int k) {
    const int r = w_.rank();
    const int64_t block = domain_ * es_;
    if (kind_ == Kind::kAllGather) {
      if (k != r) std::memcpy(out_at(k * domain_), shared_of(k), block);
      return;
    }
    at::Tensor acc = view(out_at(0), domain_);
    fold(acc, k, const_cast<char*>(shared_of(k)) + r * block, domain_);
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
        at::Tensor acc = view(w_.half(r, seq_) + off * es_, count);
        fold(acc, k, k == r ? in_at(begin_ + off) : w_.half(k, seq_) + off * es_, count);
        return;
      }
      case Kind::kReduceScatter: {
        if (len_ == 0) return;
        at::Tensor acc = view(out_at(begin_), len_);
        fold(acc, k, k == r ? in_at(r * domain_ + begin_) : w_.half(k, seq_) + r * len_ * es_,
             len_);
        return;
      }
    }
  }

  // acc = c_0 (op) c_1 (op) ... in rank order; called with k = 0, 1, ... in turn.
  void fold(at::Tensor& acc, int k, char* contribution, int64_t count) {
    if (k == 0) {
      first_ = contribution;
      return;
    }
    at::Tensor c = view(contribution, count);
    if (k == 1) {
      reduce_out(acc, view(first_, count), c, op_);
    } else {
      reduce_out(acc, acc, c, op_);
    }
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
        cpu_relax();
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
  int64_t es_;
  int64_t domain_ = 0;
  int64_t piece_elems_ = 1;
  int64_t begin_ = 0;  // the current piece: [begin_, begin_ + len_) of the domain
  int64_t len_ = 0;
  uint64_t seq_ = 0;
  Stage stage_ = Stage::kBegin;
  int k_ = 0;                          // the next rank (in rank order) of the current stage
  char* first_ = nullptr;              // rank 0's contribution, until rank 1's arrives
  ::tdist::detail::SymmetricRef sym_;  // where peers find my tensor (id 0: staged pieces)
  size_t shared_bytes_ = 0;
  bool announce_output_ = false;  // symmetric all_gather: peers read my output block, not my input
  uint64_t done_seq_ = 0;         // symmetric all_reduce: its last phase's number
  std::vector<char> scratch_;     // symmetric all_reduce: one block of the fold
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

}  // namespace tdist::mpi::detail

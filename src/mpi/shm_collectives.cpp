#include "mpi/shm_collectives.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "mpi/direct_collectives.h"
#include "tdist/detail/comm/engine/cpu_relax.h"
#include "tdist/detail/comm/engine/peer_memory.h"
#include "tdist/detail/comm/engine/reduce_kernels.h"
#include "tdist/detail/comm/engine/same_host.h"
#include "tdist/detail/comm/engine/shm_object.h"
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
    ok = ::tdist::detail::can_read_peer_word(static_cast<pid_t>(all[2 * r]),
                                             static_cast<uint64_t>(all[2 * r + 1]), kProbeMagic);
  }
  int all_ok = 0;
  check_mpi(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm),
            "MPI_Allreduce (shared-memory collectives: cross-process reads)");
  if (!all_ok) return;
  for (int r = 0; r < size_; ++r) pids_.push_back(static_cast<pid_t>(all[2 * r]));
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

using ::tdist::detail::PieceAnnouncement;
using ::tdist::detail::PiecePhase;
using ::tdist::detail::SameHostOp;
using ::tdist::detail::span_of;

// The MPI backend's channel to the same-host engine (tdist/detail/comm/engine/same_host.h), one per
// op: the window's fixed halves (ops larger than a half run as pieces), announcements in the
// segment header, and flags that a wait spins on for at most kSpin before handing the
// executor back (Note [Shared-memory collectives]).
class MPISameHostChannel final : public ::tdist::detail::SameHostChannel {
 public:
  explicit MPISameHostChannel(ShmOpContext ctx) : ctx_(std::move(ctx)), w_(*ctx_.window) {}

  int rank() const override { return w_.rank(); }
  int size() const override { return w_.size(); }
  int64_t piece_bytes() const override { return w_.piece_bytes(); }
  bool runs_empty_ops() const override { return false; }
  bool reads_plain_tensors(int64_t op_bytes, bool all_reduce) const override {
    return w_.reads_peer_memory() &&
           peer_read_window(w_.environment(), all_reduce).contains(op_bytes);
  }
  bool arrival_blocks() const override { return false; }
  uint64_t take_seq() override { return w_.take_seq(); }
  char* my_half(uint64_t seq, size_t) override { return w_.half(w_.rank(), seq); }

  bool arrive(uint64_t seq, const PieceAnnouncement& mine, const std::vector<size_t>&) override {
    int64_t* slot = w_.announcement(w_.rank(), seq);
    slot[0] = mine.direct ? 1 : 0;
    slot[1] = static_cast<int64_t>(mine.symmetric.id);
    slot[2] = mine.symmetric.offset;
    slot[3] = static_cast<int64_t>(mine.address);
    store_release(w_.arrived(w_.rank()), seq);
    return true;
  }

  // kCopied is flagged on `arrived` with a sequence number of its own.
  void signal(PiecePhase phase, uint64_t seq) override {
    store_release(flag(w_.rank(), phase), seq);
  }

  // True once the flag reached `seq`; false after spinning kSpin (poll again later). Throws
  // past the op's deadline, naming the rank that did not arrive.
  bool wait(int peer, PiecePhase phase, uint64_t seq, const char* what) override {
    const uint64_t* f = flag(peer, phase);
    if (load_acquire(f) >= seq) return true;
    const auto start = Clock::now();
    while (true) {
      for (int i = 0; i < 64; ++i) {
        ::tdist::detail::cpu_relax();
        if (load_acquire(f) >= seq) return true;
      }
      const auto now = Clock::now();
      if (now > ctx_.deadline) {
        TDIST_THROW(TimeoutError,
                    "mpi: " + ctx_.description + " over shared memory (piece #" +
                        std::to_string(seq) + ") did not complete within " +
                        std::to_string(ctx_.timeout.count()) + " ms: rank " + std::to_string(peer) +
                        " has not " + what +
                        " (it is slow, stopped, or issued a different collective; every rank "
                        "must issue the same collectives in the same order)");
      }
      if (now - start > kSpin) return false;
    }
  }

  PieceAnnouncement announcement(int peer, uint64_t seq) const override {
    const int64_t* slot = w_.announcement(peer, seq);
    PieceAnnouncement a;
    a.direct = slot[0] != 0;
    a.symmetric = {static_cast<uint64_t>(slot[1]), slot[2]};
    a.address = static_cast<uint64_t>(slot[3]);
    return a;
  }
  const char* peer_half(int peer, uint64_t seq) const override { return w_.half(peer, seq); }
  ::tdist::detail::SymmetricMappings& symmetric_mappings() override { return w_.mappings(); }
  void read_peer(int peer, uint64_t address, void* dst, size_t bytes) override {
    ::tdist::detail::read_peer_memory(w_.pid(peer), peer, address, dst, bytes, describe());
  }
  std::vector<char>& scratch(int i) override { return w_.fold_scratch(i); }
  std::string describe() const override { return "mpi: " + ctx_.description; }

 private:
  uint64_t* flag(int r, PiecePhase phase) const {
    return phase == PiecePhase::kReduced ? w_.reduced(r) : w_.arrived(r);
  }

  ShmOpContext ctx_;
  ShmWindow& w_;
};

// out = a (op) b over `count` elements: the comm layer's plain loops where there is one
// (Note [Raw reduce kernels]), else ATen. AVG folds as SUM; the caller divides.
::tdist::detail::FoldFn fold_for(ReduceOp op, const at::Tensor& like) {
  if (auto raw = ::tdist::detail::raw_reduce_fn(op, like.scalar_type())) return raw;
  const at::TensorOptions options = like.options();
  return [op, options](void* out, const void* a, const void* b, size_t count) {
    auto view = [&](const void* p) {
      return at::from_blob(const_cast<void*>(p), {static_cast<int64_t>(count)}, options);
    };
    at::Tensor o = view(out);
    reduce_out(o, view(a), view(b), op);
  };
}

// One op, the channel it runs on and the tensors it works in, alive while the executor polls
// it.
struct PolledOp {
  explicit PolledOp(ShmOpContext ctx) : channel(std::move(ctx)) {}
  MPISameHostChannel channel;
  std::vector<at::Tensor> tensors;
  std::unique_ptr<SameHostOp> op;
};

template <typename Make>
StartedOp started(ShmOpContext ctx, std::vector<at::Tensor> tensors, Make make,
                  std::function<void()> finally) {
  auto polled = std::make_shared<PolledOp>(std::move(ctx));
  polled->tensors = std::move(tensors);
  polled->op = make(polled->channel);
  StartedOp s;
  s.poll = [polled](bool& progressed) { return polled->op->advance(progressed); };
  s.on_complete = [polled, finally = std::move(finally)] {
    if (finally) finally();
  };
  return s;
}

}  // namespace

StartedOp shm_all_reduce(ShmOpContext ctx, at::Tensor buffer, ReduceOp op,
                         std::function<void()> finally) {
  auto fold = fold_for(op, buffer);
  auto make = [&](MPISameHostChannel& ch) {
    return SameHostOp::all_reduce(ch, span_of(buffer), std::move(fold));
  };
  return started(std::move(ctx), {buffer}, make, std::move(finally));
}

StartedOp shm_reduce_scatter(ShmOpContext ctx, at::Tensor in, at::Tensor out, ReduceOp op,
                             std::function<void()> finally) {
  auto fold = fold_for(op, in);
  auto make = [&](MPISameHostChannel& ch) {
    return SameHostOp::reduce_scatter(ch, span_of(in), span_of(out), std::move(fold));
  };
  return started(std::move(ctx), {in, out}, make, std::move(finally));
}

StartedOp shm_all_gather(ShmOpContext ctx, at::Tensor in, at::Tensor out,
                         std::function<void()> finally) {
  auto make = [&](MPISameHostChannel& ch) {
    return SameHostOp::all_gather(ch, span_of(in), span_of(out));
  };
  return started(std::move(ctx), {in, out}, make, std::move(finally));
}

StartedOp shm_all_gather_placed(ShmOpContext ctx, at::Tensor in, BlockPlacer place,
                                std::function<void()> finally) {
  auto make = [&](MPISameHostChannel& ch) {
    return SameHostOp::all_gather_placed(ch, span_of(in), std::move(place));
  };
  return started(std::move(ctx), {in}, make, std::move(finally));
}

}  // namespace tdist::mpi::detail

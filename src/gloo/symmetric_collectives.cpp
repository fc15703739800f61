#include "gloo/symmetric_collectives.h"

#include <cstring>

#include <ATen/ATen.h>

#include "gloo/collective_common.h"
#include "gloo/reduce_ops.h"
#include "gloo/ring.h"
#include "gloo/shm_collectives.h"
#include "tdist/error.h"

namespace tdist::detail {

// Note [Symmetric path]: when every rank's tensor lives in symmetric memory, the header
// handshake carries each rank's (allocation, offset) and peers map each other's tensors
// (SymmetricMappings, cached across collectives), so nothing is staged:
//  - all_reduce: rank r reduces chunk r of every rank's tensor into its own tensor (rank
//    order: every rank ends bitwise equal), one notification, then copies chunk c from rank
//    c's tensor for every c != r. Per rank at world 2: ~2.5 buffer sizes of memory traffic
//    instead of the staged path's ~4.
//  - reduce_scatter_tensor: rank r reduces block r of every rank's input into its output.
//  - all_gather_into_tensor: rank r announces its input when that is symmetric (FSDP's flat
//    shard: lines the peers read were written a whole step ago, not just now, which is what
//    costs most to move between cores), else block r of its output, and writes its input into
//    block r of its output before the handshake (skipped when the input already is that
//    block); then it copies rank c's announced block into block c for every c != r. Either
//    tensor being symmetric on every rank is enough; ranks may announce different ones.
// Each ends with one more notification: a rank returns only when no peer reads its tensor any
// more, so the caller may overwrite it at once. Peers write only their own tensors; what a
// rank reads from a peer is never written by that peer in the same phase.

namespace {

// Fold blocks: large enough that a block's loop amortises, small enough to stay in L2 (the
// MPI backend's direct reductions use the same; bench/HISTORY.md).
constexpr size_t kFoldBlockBytes = size_t(256) << 10;

// Every rank's tensor (this rank's own at index rank), `bytes` long, from the headers.
std::vector<const char*> symmetric_views(Exchange& ex, ShmArena& arena,
                                         const std::vector<Header>& headers, const char* mine,
                                         size_t bytes) {
  const int n = ex.size();
  std::vector<const char*> views(n);
  for (int p = 0; p < n; ++p) {
    views[p] = p == ex.rank() ? mine
                              : arena.symmetric().map(headers[p].sym_id, headers[p].sym_offset,
                                                      bytes, ex.rank(), p);
  }
  return views;
}

// Counts as an arena collective like the staged ones (their halves alternate by that count,
// which must stay equal on every rank), though it writes no half.
std::vector<Header> symmetric_handshake(Exchange& ex, ShmArena& arena, Header header,
                                        SymmetricRef ref) {
  const uint64_t op = arena.begin_op();
  header.sym_id = ref.id;
  header.sym_offset = ref.offset;
  auto headers = ex.handshake(header, {}, {});
  arena.peers_synced(op);
  check_symmetric_agreement(ex, headers, true);
  return headers;
}

}  // namespace

SymmetricRef symmetric_ref(const at::Tensor& t, at::ScalarType accumulate) {
  if (t.numel() == 0 || !t.is_contiguous() || t.scalar_type() != accumulate) return {};
  return find_symmetric(t.data_ptr(), t.nbytes());
}

void check_symmetric_agreement(const Exchange& ex, const std::vector<Header>& headers, bool mine) {
  for (int p = 0; p < ex.size(); ++p) {
    if ((headers[p].sym_id != 0) == mine) continue;
    const int sym = mine ? ex.rank() : p;
    const int plain = mine ? p : ex.rank();
    TDIST_THROW(DistBackendError,
                rank_prefix(ex.rank(), ex.info().op) + "rank " + std::to_string(sym) +
                    " passed a tensor in symmetric memory and rank " + std::to_string(plain) +
                    " did not: pass contiguous symmetric-memory tensors of the reduction's dtype "
                    "(tdist::symmetric_memory::empty) on every rank, or on none");
  }
}

void symmetric_all_reduce(Exchange& ex, ShmArena& arena, at::Tensor& t, ReduceOp op,
                          SymmetricRef ref) {
  const int n = ex.size();
  const int r = ex.rank();
  const auto dtype = t.scalar_type();
  const size_t esz = c10::elementSize(dtype);
  const size_t numel = t.numel();
  auto headers = symmetric_handshake(ex, arena, header_for(t, numel, static_cast<int>(op)), ref);
  char* data = bytes_of(t);
  auto views = symmetric_views(ex, arena, headers, data, t.nbytes());
  const auto counts = even_chunks(numel, n);
  std::vector<size_t> offset(n, 0);
  for (int c = 1; c < n; ++c) offset[c] = offset[c - 1] + counts[c - 1] * esz;
  const ReduceFn fn = make_reduce_fn(op, dtype);
  // In cache-sized blocks. This rank's own chunk is one of the inputs: steps before the last
  // accumulate in a scratch block (world > 2), the last writes the chunk in place (by then
  // every other contribution to the block has been read, and an elementwise op may write the
  // very elements it reads).
  const size_t per_block = std::max<size_t>(kFoldBlockBytes / esz, 1);
  std::vector<char> scratch(n > 2 ? std::min(per_block, counts[r]) * esz : 0);
  for (size_t done = 0; n > 1 && done < counts[r]; done += per_block) {
    const size_t k = std::min(per_block, counts[r] - done);
    const size_t at = offset[r] + done * esz;
    if (n == 2) {
      fn(data + at, views[0] + at, views[1] + at, k);
      continue;
    }
    fold_in_rank_order(fn, scratch.data(), n - 1, k, [&](int p) { return views[p] + at; });
    fn(data + at, scratch.data(), views[n - 1] + at, k);
  }
  finish_average(op, data + offset[r], counts[r], dtype, n);
  shm_notify_all(ex, arena);
  for (int c = 0; c < n; ++c) {
    if (c != r) std::memcpy(data + offset[c], views[c] + offset[c], counts[c] * esz);
  }
  shm_notify_all(ex, arena);
}

void symmetric_reduce_scatter(Exchange& ex, ShmArena& arena, at::Tensor& out, const at::Tensor& in,
                              ReduceOp op, SymmetricRef ref) {
  const int n = ex.size();
  const int r = ex.rank();
  const auto dtype = in.scalar_type();
  const size_t numel = out.numel();
  const size_t chunk = numel * c10::elementSize(dtype);
  auto headers = symmetric_handshake(ex, arena, header_for(out, numel, static_cast<int>(op)), ref);
  auto views = symmetric_views(ex, arena, headers, bytes_of(in), in.nbytes());
  at::Tensor work = staged_output(out, dtype);
  char* dst = bytes_of(work);
  const ReduceFn fn = make_reduce_fn(op, dtype);
  if (n == 1) {
    std::memcpy(dst, views[0], chunk);
  } else {
    fold_in_rank_order(fn, dst, n, numel, [&](int p) { return views[p] + r * chunk; });
  }
  finish_average(op, dst, numel, dtype, n);
  shm_notify_all(ex, arena);
  unstage(out, work);
}

void symmetric_all_gather(Exchange& ex, ShmArena& arena, at::Tensor& out, const at::Tensor& in,
                          SymmetricRef ref) {
  const int n = ex.size();
  const int r = ex.rank();
  const size_t bytes = in.nbytes();
  at::Tensor work = staged_output(out, out.scalar_type());
  char* data = bytes_of(work);
  char* block = data + r * bytes;
  if (!in.is_contiguous()) {
    at::from_blob(block, in.sizes(), at::TensorOptions().dtype(in.scalar_type())).copy_(in);
  } else if (in.data_ptr() != block) {
    std::memcpy(block, in.data_ptr(), bytes);
  }
  auto headers = symmetric_handshake(ex, arena, header_for(in, in.numel()), ref);
  auto views = symmetric_views(ex, arena, headers, block, bytes);
  for (int c = 0; c < n; ++c) {
    if (c != r) std::memcpy(data + c * bytes, views[c], bytes);
  }
  shm_notify_all(ex, arena);
  unstage(out, work);
}

void symmetric_all_gather_placed(Exchange& ex, ShmArena& arena, const at::Tensor& in,
                                 SymmetricRef ref, const CollectiveBackend::BlockPlacer& place) {
  auto headers = symmetric_handshake(ex, arena, header_for(in, in.numel()), ref);
  auto views = symmetric_views(ex, arena, headers, bytes_of(in), in.nbytes());
  for (int c = 0; c < ex.size(); ++c) place(c, views[c]);
  shm_notify_all(ex, arena);
}

}  // namespace tdist::detail

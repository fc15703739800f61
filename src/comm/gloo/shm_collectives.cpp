#include "comm/gloo/shm_collectives.h"

#include <cstring>
#include <functional>

#include <ATen/ATen.h>

#include "comm/gloo/collective_common.h"
#include "comm/gloo/ring.h"
#include "tdist/error.h"

namespace tdist::detail {

namespace {

// Up to this many ranks, all_reduce has every rank reduce the whole buffer (one round);
// beyond, each rank reduces one chunk and gathers the others (two rounds, less traffic).
constexpr int kWholeReduceMaxRanks = 4;

// Fills this rank's half of the arena (through `fill`), runs the header handshake announcing
// it and returns every rank's half (this rank's own at index rank), mapped and at least
// `bytes` long.
std::vector<char*> publish(Exchange& ex, ShmArena& arena, Header header, size_t bytes,
                           const std::function<void(char*)>& fill) {
  const int n = ex.size();
  const int r = ex.rank();
  const uint64_t op = arena.begin_op();
  const int parity = static_cast<int>(op % 2);
  char* mine = arena.local(bytes, parity);
  if (mine) {
    fill(mine);
    header.shm_key = arena.key();
    header.shm_gen = arena.generation();
  }
  std::vector<Header> headers = ex.handshake(header, {}, {});
  arena.peers_synced(op);
  for (int p = 0; p < n; ++p) {
    if (headers[p].shm_key != 0) continue;
    TDIST_THROW(DistBackendError,
                rank_prefix(r, ex.info().op) + "rank " + std::to_string(p) +
                    " could not get shared memory for " + std::to_string(bytes) + " bytes" +
                    (p == r ? ": " + arena.last_error() : std::string(" (see its error)")) +
                    "; free /dev/shm or set TDIST_GLOO_SHM=0 to move data over TCP");
  }
  std::vector<char*> halves(n);
  for (int p = 0; p < n; ++p) {
    halves[p] = p == r ? mine
                       : const_cast<char*>(arena.remote(p, headers[p].shm_key, headers[p].shm_gen,
                                                        parity, bytes));
  }
  return halves;
}

at::Tensor view_of(char* ptr, at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::from_blob(ptr, sizes, at::TensorOptions().dtype(dtype));
}

// One-byte notification to and from every peer (key unique within the collective).
void notify_all(Exchange& ex, uint64_t key) {
  const int n = ex.size();
  static const char kByte = 1;
  std::vector<char> in(n);
  for (int p = 0; p < n; ++p) {
    if (p != ex.rank()) ex.post_recv(p, &in[p], 1, key, 0);
  }
  for (int p = 0; p < n; ++p) {
    if (p != ex.rank()) ex.post_send(p, &kByte, 1, key, 0);
  }
  ex.wait_all();
}

}  // namespace

void shm_all_reduce(Exchange& ex, ShmArena& arena, at::Tensor& t, ReduceOp op) {
  const int n = ex.size();
  const int r = ex.rank();
  const auto acc = accumulation_dtype(t.scalar_type());
  const size_t esz = c10::elementSize(acc);
  const size_t numel = t.numel();
  auto half = publish(ex, arena, header_for(t, numel, static_cast<int>(op)), numel * esz,
                      [&](char* p) { view_of(p, t.sizes(), acc).copy_(t); });
  const ReduceFn fn = make_reduce_fn(op, acc);
  if (n <= kWholeReduceMaxRanks) {
    // Every rank reduces the whole buffer from every half, in rank order (so all ranks get
    // bitwise the same result): one synchronisation instead of two, and for few ranks no
    // more memory traffic than reducing one chunk and gathering the others.
    at::Tensor work = staged_output(t, acc);
    char* dst = bytes_of(work);
    if (numel > 0) {
      fn(dst, half[0], half[1], numel);
      for (int p = 2; p < n; ++p) fn(dst, dst, half[p], numel);
    }
    finish_average(op, dst, numel, acc, n);
    unstage(t, work);
    return;
  }
  const auto counts = even_chunks(numel, n);
  std::vector<size_t> offset(n, 0);
  for (int c = 1; c < n; ++c) offset[c] = offset[c - 1] + counts[c - 1] * esz;
  // This rank reduces chunk r into its own half; peers read it after the notification.
  char* out = half[r] + offset[r];
  for (int p = 0; p < n; ++p) {
    if (p != r && counts[r] > 0) fn(out, out, half[p] + offset[r], counts[r]);
  }
  finish_average(op, out, counts[r], acc, n);
  notify_all(ex, kPhase2);
  if (t.is_contiguous() && t.scalar_type() == acc) {
    char* dst = bytes_of(t);
    for (int c = 0; c < n; ++c) std::memcpy(dst + offset[c], half[c] + offset[c], counts[c] * esz);
  } else {
    // Peers are done reading the unreduced chunks of this half: assemble the result in it.
    for (int c = 0; c < n; ++c) {
      if (c != r) std::memcpy(half[r] + offset[c], half[c] + offset[c], counts[c] * esz);
    }
    t.copy_(view_of(half[r], t.sizes(), acc));
  }
}

void shm_all_gather(Exchange& ex, ShmArena& arena, at::Tensor& out, const at::Tensor& in) {
  const int n = ex.size();
  const size_t bytes = in.nbytes();
  auto half = publish(ex, arena, header_for(in, in.numel()), bytes,
                      [&](char* p) { view_of(p, in.sizes(), in.scalar_type()).copy_(in); });
  at::Tensor work = staged_output(out, out.scalar_type());
  char* dst = bytes_of(work);
  for (int c = 0; c < n; ++c) std::memcpy(dst + c * bytes, half[c], bytes);
  unstage(out, work);
}

void shm_reduce_scatter(Exchange& ex, ShmArena& arena, at::Tensor& out, const at::Tensor& in,
                        ReduceOp op) {
  const int n = ex.size();
  const int r = ex.rank();
  const auto acc = accumulation_dtype(out.scalar_type());
  const size_t esz = c10::elementSize(acc);
  const size_t numel = out.numel();
  const size_t chunk = numel * esz;
  auto half = publish(ex, arena, header_for(out, numel, static_cast<int>(op)), chunk * n,
                      [&](char* p) { view_of(p, in.sizes(), acc).copy_(in); });
  at::Tensor work = staged_output(out, acc);
  char* dst = bytes_of(work);
  const ReduceFn fn = make_reduce_fn(op, acc);
  // Rank order (0, 1, ...), the same on every rank.
  if (numel > 0) {
    fn(dst, half[0] + r * chunk, half[1] + r * chunk, numel);
    for (int p = 2; p < n; ++p) fn(dst, dst, half[p] + r * chunk, numel);
  }
  finish_average(op, dst, numel, acc, n);
  unstage(out, work);
}

}  // namespace tdist::detail

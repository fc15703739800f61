#include "gloo/shm_collectives.h"

#include <cstring>
#include <functional>
#include <thread>

#include <ATen/ATen.h>

#include "gloo/collective_common.h"
#include "gloo/ring.h"
#include "gloo/symmetric_collectives.h"
#include "tdist/comm/engine/cpu_relax.h"
#include "tdist/error.h"

namespace tdist::detail {

namespace {

// Note [Falling back to TCP]: a rank that cannot get a large enough segment (/dev/shm full, as
// with Docker's default 64 MiB, or over TDIST_GLOO_SHM_MAX_BYTES) announces key 0 in its
// header. Every rank sees every header, so all of them agree to move this collective's data
// over TCP instead (the handshake is done; the caller runs the TCP algorithm), and later
// collectives try shared memory again. The rank that lacked memory says so once on stderr.

// Fills this rank's half of the arena (through `fill`), runs the header handshake announcing
// it (with per-peer payload sizes, when given, for the pairwise check) and returns every
// rank's half (this rank's own at index rank), mapped and at least need[p] long; empty when
// some rank has no segment (fall back to TCP).
std::vector<char*> publish(Exchange& ex, ShmArena& arena, Header header,
                           const std::vector<size_t>& need, const std::function<void(char*)>& fill,
                           const std::vector<int64_t>& send = {},
                           const std::vector<int64_t>& recv = {}) {
  const int n = ex.size();
  const int r = ex.rank();
  const uint64_t op = arena.begin_op();
  const int parity = static_cast<int>(op % 2);
  char* mine = arena.local(need[r], parity);
  if (mine) {
    fill(mine);
    header.shm_key = arena.key();
    header.shm_gen = arena.generation();
  }
  std::vector<Header> headers = ex.handshake(header, send, recv);
  arena.peers_synced(op);
  check_symmetric_agreement(ex, headers, false);
  for (int p = 0; p < n; ++p) {
    if (headers[p].shm_key != 0) continue;
    if (p == r) arena.warn_fallback(need[p]);
    return {};
  }
  // Every announced segment is mapped now, even one this collective does not read: its owner
  // unlinks the name once this rank's next header arrives (ShmArena::peers_synced).
  std::vector<char*> halves(n);
  for (int p = 0; p < n; ++p) {
    halves[p] = p == r ? mine
                       : const_cast<char*>(arena.remote(p, headers[p].shm_key, headers[p].shm_gen,
                                                        parity, need[p]));
  }
  return halves;
}

std::vector<size_t> everyone(int n, size_t bytes) {
  return std::vector<size_t>(n, bytes);
}

at::Tensor view_of(char* ptr, at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::from_blob(ptr, sizes, at::TensorOptions().dtype(dtype));
}

}  // namespace

namespace {

// Whether notification `flag` is at or past `number` (modulo 2^32).
bool reached(uint32_t flag, uint32_t number) {
  return static_cast<int32_t>(flag - number) >= 0;
}

// Waits for `peer`'s notification `number`: a short spin (the peer is usually there
// already), then sleeping on its flag (Note [Flag notifications]), against the collective's
// deadline and with the dead-peer probe every 100 ms.
void wait_for(Exchange& ex, ShmArena& arena, int peer, uint32_t number) {
  for (int i = 0; i < 256; ++i) {
    if (reached(arena.flag(peer), number)) return;
    cpu_relax();
  }
  auto next_probe = Clock::now() + std::chrono::milliseconds(100);
  for (;;) {
    const uint32_t seen = arena.flag(peer);
    if (reached(seen, number)) return;
    const auto now = Clock::now();
    auto what = [&] {
      return rank_prefix(ex.rank(), ex.info().op) + "#" + std::to_string(ex.info().seq) +
             " waiting for rank " + std::to_string(peer) + " in shared memory: ";
    };
    if (now >= ex.info().deadline) {
      TDIST_THROW(TimeoutError, what() + "timed out after " +
                                    std::to_string(ex.info().timeout.count()) +
                                    " ms (is it stopped, hung or running other collectives?); "
                                    "the group is now broken");
    }
    if (now >= next_probe) {
      if (std::exception_ptr error = ex.comm().peer_error(peer)) {
        std::string why = "connection failed";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          why = e.what();
        } catch (...) {
        }
        TDIST_THROW(NetworkError, what() +
                                      "lost the connection to it (the peer died or closed "
                                      "the group); the group is now broken: " +
                                      why);
      }
      next_probe = now + std::chrono::milliseconds(100);
    }
    const auto until = std::min(next_probe, ex.info().deadline);
    arena.sleep_on(peer, seen,
                   std::chrono::duration_cast<std::chrono::microseconds>(until - now) +
                       std::chrono::microseconds(1));
  }
}

}  // namespace

void shm_notify_all(Exchange& ex, ShmArena& arena) {
  const uint32_t number = arena.arrive();
  for (int p = 0; p < ex.size(); ++p) {
    if (p != ex.rank()) wait_for(ex, arena, p, number);
  }
}

namespace {

// Reduces and publishes in blocks this large, so that each block's partial sum stays in the
// core's cache between the reduction and its two copies out.
constexpr size_t kBlockBytes = size_t(64) << 10;

// Copies `bytes` from `src` to `dst` (contiguous, same dtype) or converts through ATen.
void copy_into(char* dst, const at::Tensor& src, at::ScalarType dtype) {
  if (src.is_contiguous() && src.scalar_type() == dtype) {
    std::memcpy(dst, src.data_ptr(), src.nbytes());
  } else {
    view_of(dst, src.sizes(), dtype).copy_(src);
  }
}

// The whole buffer reduced by every rank from every half, in rank order: one synchronisation,
// used when the tensor needs a working copy anyway (non-contiguous, or reduced in a wider dtype).
bool reduce_whole(Exchange& ex, ShmArena& arena, at::Tensor& t, ReduceOp op, at::ScalarType acc) {
  const int n = ex.size();
  const size_t numel = t.numel();
  auto half =
      publish(ex, arena, header_for(t, numel, static_cast<int>(op)),
              everyone(n, numel * c10::elementSize(acc)), [&](char* p) { copy_into(p, t, acc); });
  if (half.empty()) return false;
  const ReduceFn fn = make_reduce_fn(op, acc);
  at::Tensor work = staged_output(t, acc);
  char* dst = bytes_of(work);
  if (numel > 0) {
    fold_in_rank_order(fn, dst, n, numel, [&](int p) { return half[p]; });
  }
  finish_average(op, dst, numel, acc, n);
  unstage(t, work);
  return true;
}

}  // namespace

// A contiguous tensor in its accumulation dtype is reduced in place as a reduce-scatter and an
// all-gather through the arena: each rank publishes only the chunks its peers reduce, reduces
// its own chunk (rank order, so every rank ends bitwise equal) from its tensor and their
// halves, publishes that result, and after one notification copies the other chunks back.
// Per rank that moves about 4 buffer sizes through memory instead of 3 + world size, which is
// what bounds a large all_reduce on one host.
bool shm_all_reduce(Exchange& ex, ShmArena& arena, at::Tensor& t, ReduceOp op) {
  const int n = ex.size();
  const int r = ex.rank();
  const auto acc = accumulation_dtype(t.scalar_type());
  if (SymmetricRef ref = symmetric_ref(t, acc); ref.id != 0) {
    symmetric_all_reduce(ex, arena, t, op, ref);
    return true;
  }
  if (!(t.is_contiguous() && t.scalar_type() == acc)) return reduce_whole(ex, arena, t, op, acc);
  const size_t esz = c10::elementSize(acc);
  const size_t numel = t.numel();
  const auto counts = even_chunks(numel, n);
  std::vector<size_t> offset(n, 0);
  for (int c = 1; c < n; ++c) offset[c] = offset[c - 1] + counts[c - 1] * esz;
  char* data = bytes_of(t);
  auto half = publish(ex, arena, header_for(t, numel, static_cast<int>(op)),
                      everyone(n, numel * esz), [&](char* p) {
                        for (int c = 0; c < n; ++c) {
                          if (c != r) std::memcpy(p + offset[c], data + offset[c], counts[c] * esz);
                        }
                      });
  if (half.empty()) return false;
  const ReduceFn fn = make_reduce_fn(op, acc);
  std::vector<char> block(std::min(kBlockBytes, std::max<size_t>(counts[r] * esz, 1)));
  const size_t per_block = std::max<size_t>(block.size() / esz, 1);
  auto source = [&](int p, size_t at) -> const char* {
    return (p == r ? data : half[p]) + offset[r] + at;
  };
  for (size_t done = 0; done < counts[r]; done += per_block) {
    const size_t k = std::min(per_block, counts[r] - done);
    const size_t at = done * esz;
    fold_in_rank_order(fn, block.data(), n, k, [&](int p) { return source(p, at); });
    finish_average(op, block.data(), k, acc, n);
    std::memcpy(data + offset[r] + at, block.data(), k * esz);
    std::memcpy(half[r] + offset[r] + at, block.data(), k * esz);
  }
  shm_notify_all(ex, arena);
  for (int c = 0; c < n; ++c) {
    if (c != r) std::memcpy(data + offset[c], half[c] + offset[c], counts[c] * esz);
  }
  return true;
}

namespace {

// all_gather's staged path: every rank's input copied into its half of the arena (empty when
// some rank has no room: TCP then).
std::vector<char*> publish_inputs(Exchange& ex, ShmArena& arena, const at::Tensor& in) {
  return publish(ex, arena, header_for(in, in.numel()), everyone(ex.size(), in.nbytes()),
                 [&](char* p) { copy_into(p, in, in.scalar_type()); });
}

}  // namespace

bool shm_all_gather(Exchange& ex, ShmArena& arena, at::Tensor& out, const at::Tensor& in) {
  // Peers read this rank's input when it is symmetric, else its block of the output.
  SymmetricRef ref = symmetric_ref(in, in.scalar_type());
  if (ref.id == 0) {
    ref = symmetric_ref(out, out.scalar_type());
    if (ref.id != 0) ref.offset += static_cast<int64_t>(ex.rank() * in.nbytes());
  }
  if (ref.id != 0) {
    symmetric_all_gather(ex, arena, out, in, ref);
    return true;
  }
  const size_t bytes = in.nbytes();
  auto half = publish_inputs(ex, arena, in);
  if (half.empty()) return false;
  at::Tensor work = staged_output(out, out.scalar_type());
  char* dst = bytes_of(work);
  for (int c = 0; c < ex.size(); ++c) std::memcpy(dst + c * bytes, half[c], bytes);
  unstage(out, work);
  return true;
}

bool shm_all_gather_placed(Exchange& ex, ShmArena& arena, const at::Tensor& in,
                           const CollectiveBackend::BlockPlacer& place) {
  if (SymmetricRef ref = symmetric_ref(in, in.scalar_type()); ref.id != 0) {
    symmetric_all_gather_placed(ex, arena, in, ref, place);
    return true;
  }
  auto half = publish_inputs(ex, arena, in);
  if (half.empty()) return false;
  for (int c = 0; c < ex.size(); ++c) place(c, half[c]);
  return true;
}

bool shm_reduce_scatter(Exchange& ex, ShmArena& arena, at::Tensor& out, const at::Tensor& in,
                        ReduceOp op) {
  const int n = ex.size();
  const int r = ex.rank();
  const auto acc = accumulation_dtype(out.scalar_type());
  if (SymmetricRef ref = symmetric_ref(in, acc); ref.id != 0) {
    symmetric_reduce_scatter(ex, arena, out, in, op, ref);
    return true;
  }
  const size_t esz = c10::elementSize(acc);
  const size_t numel = out.numel();
  const size_t chunk = numel * esz;
  auto half = publish(ex, arena, header_for(out, numel, static_cast<int>(op)),
                      everyone(n, chunk * n), [&](char* p) { copy_into(p, in, acc); });
  if (half.empty()) return false;
  at::Tensor work = staged_output(out, acc);
  char* dst = bytes_of(work);
  const ReduceFn fn = make_reduce_fn(op, acc);
  if (numel > 0) {
    fold_in_rank_order(fn, dst, n, numel, [&](int p) { return half[p] + r * chunk; });
  }
  finish_average(op, dst, numel, acc, n);
  unstage(out, work);
  return true;
}

bool shm_broadcast(Exchange& ex, ShmArena& arena, at::Tensor& t, int root) {
  const int n = ex.size();
  const bool is_root = ex.rank() == root;
  std::vector<size_t> need(n, 0);
  need[root] = t.nbytes();
  auto half = publish(ex, arena, header_for(t, t.numel(), -1, root), need, [&](char* p) {
    if (is_root) copy_into(p, t, t.scalar_type());
  });
  if (half.empty()) return false;
  if (is_root || t.numel() == 0) return true;
  at::Tensor work = staged_output(t, t.scalar_type());
  std::memcpy(bytes_of(work), half[root], t.nbytes());
  unstage(t, work);
  return true;
}

bool shm_all_to_all(Exchange& ex, ShmArena& arena, at::Tensor& out, const at::Tensor& in,
                    const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  const int n = ex.size();
  const int r = ex.rank();
  const size_t block = in.nbytes() / n;
  auto half = publish(
      ex, arena, header_for(in, 0), everyone(n, in.nbytes()),
      [&](char* p) { copy_into(p, in, in.scalar_type()); }, send, recv);
  if (half.empty()) return false;
  at::Tensor work = staged_output(out, out.scalar_type());
  char* dst = bytes_of(work);
  for (int c = 0; c < n; ++c) std::memcpy(dst + c * block, half[c] + r * block, block);
  unstage(out, work);
  return true;
}

}  // namespace tdist::detail

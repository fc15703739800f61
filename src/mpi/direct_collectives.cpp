#include "mpi/direct_collectives.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <string>

#include "mpi/mpi_types.h"
#include "tdist/error.h"

namespace tdist::mpi::detail {

namespace {

constexpr int kDirectMaxRanks = 8;
constexpr size_t kPoolMaxBuffers = 4;

// Pointer to element `offset` of a contiguous tensor.
void* at_element(const at::Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data_ptr()) + offset * t.element_size();
}

// `count` elements of `like`'s dtype viewed over the start of a uint8 scratch buffer.
at::Tensor typed(const at::Tensor& scratch, int64_t count, const at::Tensor& like) {
  return scratch.narrow(0, 0, count * like.element_size()).view(like.scalar_type());
}

}  // namespace

void reduce_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
      at::add_out(out, a, b);
      return;
    case ReduceOp::PRODUCT:
      at::mul_out(out, a, b);
      return;
    case ReduceOp::MIN:
      at::minimum_out(out, a, b);
      return;
    case ReduceOp::MAX:
      at::maximum_out(out, a, b);
      return;
    default:
      break;
  }
  TDIST_THROW(InvalidArgument, "mpi: direct collectives cannot apply " + to_string(op));
}

at::Tensor ScratchPool::take(int64_t bytes) {
  auto it = free_.lower_bound(bytes);
  if (it != free_.end()) {
    at::Tensor buffer = std::move(it->second);
    free_.erase(it);
    return buffer;
  }
  return at::empty({std::max<int64_t>(bytes, 1)}, at::kByte);
}

void ScratchPool::put(at::Tensor buffer) {
  free_.emplace(buffer.numel(), std::move(buffer));
  // Keep the largest few: steady-state training reuses the same sizes.
  while (free_.size() > kPoolMaxBuffers) free_.erase(free_.begin());
}

int take_tag(const DirectComm& c) {
  return static_cast<int>((*c.sequence)++ % 16000) * 2;
}

bool reduce_out_supports(at::ScalarType dtype, ReduceOp op) {
  if (dtype == at::kBool) return false;
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
    case ReduceOp::PRODUCT:
    case ReduceOp::MIN:
    case ReduceOp::MAX:
      return true;
    default:
      return false;
  }
}

bool use_direct(int64_t min_bytes, int size, int64_t bytes, at::ScalarType dtype, bool reduces,
                ReduceOp op) {
  if (min_bytes < 0 || size < 2 || size > kDirectMaxRanks || bytes < min_bytes) return false;
  if (!reduces) return true;
  return reduce_out_supports(dtype, op);
}

StartedOp direct_reduce_scatter(const DirectComm& c, at::Tensor in, at::Tensor out, ReduceOp op,
                                int tag, std::function<void()> finally) {
  const int64_t m = out.numel();
  const int count = static_cast<int>(m);
  const MPI_Datatype type = mpi_datatype(out.scalar_type());
  at::Tensor scratch = c.pool->take((c.size - 1) * m * out.element_size());
  at::Tensor received = typed(scratch, (c.size - 1) * m, out);
  StartedOp s;
  s.requests.reserve(2 * (c.size - 1));
  int slot = 0;
  for (int peer = 0; peer < c.size; ++peer) {
    if (peer == c.rank) continue;
    s.requests.emplace_back();
    check_mpi(MPI_Irecv(at_element(received, slot * m), count, type, peer, tag, c.comm,
                        &s.requests.back()),
              "MPI_Irecv (reduce_scatter)");
    s.requests.emplace_back();
    check_mpi(
        MPI_Isend(at_element(in, peer * m), count, type, peer, tag, c.comm, &s.requests.back()),
        "MPI_Isend (reduce_scatter)");
    ++slot;
  }
  auto pool = c.pool;
  const int rank = c.rank, size = c.size;
  s.on_complete = [in, out, received, scratch, pool, op, m, rank, size,
                   finally = std::move(finally)]() mutable {
    at::Tensor flat_out = out.view({-1});
    at::Tensor mine = in.view({-1}).narrow(0, rank * m, m);
    for (int k = 0; k < size - 1; ++k) {
      reduce_out(flat_out, k == 0 ? mine : flat_out, received.narrow(0, k * m, m), op);
    }
    pool->put(std::move(scratch));
    if (finally) finally();
  };
  return s;
}

StartedOp direct_all_gather(const DirectComm& c, at::Tensor in, at::Tensor out, int tag,
                            std::function<void()> finally) {
  const int64_t m = in.numel();
  const int count = static_cast<int>(m);
  const MPI_Datatype type = mpi_datatype(in.scalar_type());
  at::Tensor own = out.view({-1}).narrow(0, c.rank * m, m);
  if (own.data_ptr() != in.data_ptr()) own.copy_(in.view({-1}));
  StartedOp s;
  s.requests.reserve(2 * (c.size - 1));
  for (int peer = 0; peer < c.size; ++peer) {
    if (peer == c.rank) continue;
    s.requests.emplace_back();
    check_mpi(
        MPI_Irecv(at_element(out, peer * m), count, type, peer, tag, c.comm, &s.requests.back()),
        "MPI_Irecv (all_gather)");
    s.requests.emplace_back();
    check_mpi(MPI_Isend(in.data_ptr(), count, type, peer, tag, c.comm, &s.requests.back()),
              "MPI_Isend (all_gather)");
  }
  s.on_complete = [in, out, finally = std::move(finally)] {
    if (finally) finally();
  };
  return s;
}

StartedOp direct_all_reduce(const DirectComm& c, at::Tensor buffer, ReduceOp op, int tag,
                            std::function<void()> finally) {
  at::Tensor flat = buffer.view({-1});
  const int64_t total = flat.numel();
  const int size = c.size, rank = c.rank;
  // Chunk j is [start(j), start(j + 1)): sizes differ by at most one element.
  auto start = [total, size](int j) { return total * j / size; };
  const int64_t my_begin = start(rank), my_len = start(rank + 1) - my_begin;
  const MPI_Datatype type = mpi_datatype(flat.scalar_type());
  at::Tensor scratch = c.pool->take((size - 1) * my_len * flat.element_size());
  at::Tensor received = typed(scratch, (size - 1) * my_len, flat);

  // Stage 1: reduce-scatter. Chunk j goes to rank j; this rank's chunk comes from everyone.
  StartedOp s;
  s.requests.reserve(2 * (size - 1));
  int slot = 0;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    s.requests.emplace_back();
    check_mpi(MPI_Irecv(at_element(received, slot * my_len), static_cast<int>(my_len), type, peer,
                        tag, c.comm, &s.requests.back()),
              "MPI_Irecv (all_reduce)");
    s.requests.emplace_back();
    check_mpi(
        MPI_Isend(at_element(flat, start(peer)), static_cast<int>(start(peer + 1) - start(peer)),
                  type, peer, tag, c.comm, &s.requests.back()),
        "MPI_Isend (all_reduce)");
    ++slot;
  }
  auto pool = c.pool;
  s.on_complete = [flat, received, scratch, pool, op, my_begin, my_len, size]() mutable {
    at::Tensor mine = flat.narrow(0, my_begin, my_len);
    for (int k = 0; k < size - 1; ++k) {
      reduce_out(mine, mine, received.narrow(0, k * my_len, my_len), op);
    }
    pool->put(std::move(scratch));
  };
  // Stage 2: all-gather of the reduced chunks (every stage-1 send has completed, so the
  // chunks they read may be overwritten).
  DirectComm comm = c;
  s.next = [comm, flat, start, my_begin, my_len, type, tag, finally = std::move(finally)] {
    StartedOp g;
    g.requests.reserve(2 * (comm.size - 1));
    for (int peer = 0; peer < comm.size; ++peer) {
      if (peer == comm.rank) continue;
      g.requests.emplace_back();
      check_mpi(
          MPI_Irecv(at_element(flat, start(peer)), static_cast<int>(start(peer + 1) - start(peer)),
                    type, peer, tag + 1, comm.comm, &g.requests.back()),
          "MPI_Irecv (all_reduce)");
      g.requests.emplace_back();
      check_mpi(MPI_Isend(at_element(flat, my_begin), static_cast<int>(my_len), type, peer, tag + 1,
                          comm.comm, &g.requests.back()),
                "MPI_Isend (all_reduce)");
    }
    g.on_complete = [flat, finally] {
      if (finally) finally();
    };
    return g;
  };
  return s;
}

}  // namespace tdist::mpi::detail

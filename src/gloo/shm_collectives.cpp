#include "gloo/shm_collectives.h"

#include <ATen/ATen.h>

#include "gloo/collective_common.h"
#include "gloo/same_host_channel.h"
#include "tdist/detail/comm/engine/same_host.h"

namespace tdist::detail {

// Note [Symmetric path]: when every rank's tensor lives in symmetric memory
// (tdist/comm/symmetric_memory.h), the header handshake carries each rank's (allocation,
// offset) and peers map each other's tensors (SymmetricMappings, cached across collectives),
// so nothing is staged: the engine's direct ops (Note [Same-host collectives]). Per rank at
// world 2 an all_reduce moves ~2.5 buffer sizes through memory instead of the staged path's
// ~4. all_gather announces its input when that is symmetric (FSDP's flat shard: lines the
// peers read were written a whole step ago, not just now, which is what costs most to move
// between cores), else its block of the output; either tensor being symmetric on every rank is
// enough. A tensor takes the path as it is: non-empty, contiguous, already in the dtype the
// reduction accumulates in (anything else is staged through a working copy first).

namespace {

// Runs `op` to the end; false when it fell back to TCP.
bool ran(std::unique_ptr<SameHostOp> op) {
  op->run();
  return !op->fell_back();
}

FinishFn average_over(ReduceOp op, at::ScalarType dtype, int world_size) {
  if (op != ReduceOp::AVG) return nullptr;
  return [dtype, world_size](void* ptr, size_t count) {
    finish_average(ReduceOp::AVG, ptr, count, dtype, world_size);
  };
}

}  // namespace

bool shm_all_reduce(Exchange& ex, ShmArena& arena, at::Tensor& t, ReduceOp op) {
  const auto acc = accumulation_dtype(t.scalar_type());
  at::Tensor work = staged(t, acc);
  GlooSameHostChannel channel(ex, arena, header_for(t, t.numel(), op.code()));
  if (!ran(SameHostOp::all_reduce(channel, span_of(work), make_reduce_fn(op, acc),
                                  average_over(op, acc, ex.size())))) {
    return false;
  }
  unstage(t, work);
  return true;
}

bool shm_all_gather(Exchange& ex, ShmArena& arena, at::Tensor& out, const at::Tensor& in) {
  at::Tensor input = in.contiguous();
  at::Tensor work = staged_output(out, out.scalar_type());
  GlooSameHostChannel channel(ex, arena, header_for(in, in.numel()));
  if (!ran(SameHostOp::all_gather(channel, span_of(input), span_of(work)))) return false;
  unstage(out, work);
  return true;
}

bool shm_all_gather_placed(Exchange& ex, ShmArena& arena, const at::Tensor& in,
                           const CollectiveBackend::BlockPlacer& place) {
  at::Tensor input = in.contiguous();
  GlooSameHostChannel channel(ex, arena, header_for(in, in.numel()));
  return ran(SameHostOp::all_gather_placed(channel, span_of(input), place));
}

bool shm_reduce_scatter(Exchange& ex, ShmArena& arena, at::Tensor& out, const at::Tensor& in,
                        ReduceOp op) {
  const auto acc = accumulation_dtype(out.scalar_type());
  at::Tensor input = staged(in, acc);
  at::Tensor work = staged_output(out, acc);
  GlooSameHostChannel channel(ex, arena, header_for(out, out.numel(), op.code()));
  if (!ran(SameHostOp::reduce_scatter(channel, span_of(input), span_of(work),
                                      make_reduce_fn(op, acc), average_over(op, acc, ex.size())))) {
    return false;
  }
  unstage(out, work);
  return true;
}

bool shm_broadcast(Exchange& ex, ShmArena& arena, at::Tensor& t, int root) {
  const bool is_root = ex.rank() == root;
  at::Tensor work = is_root ? staged(t, t.scalar_type()) : staged_output(t, t.scalar_type());
  GlooSameHostChannel channel(ex, arena, header_for(t, t.numel(), -1, root));
  if (!ran(SameHostOp::broadcast(channel, span_of(work), root))) return false;
  if (!is_root) unstage(t, work);
  return true;
}

bool shm_all_to_all(Exchange& ex, ShmArena& arena, at::Tensor& out, const at::Tensor& in,
                    const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  at::Tensor input = in.contiguous();
  at::Tensor work = staged_output(out, out.scalar_type());
  GlooSameHostChannel channel(ex, arena, header_for(in, 0), send, recv);
  if (!ran(SameHostOp::all_to_all(channel, span_of(input), span_of(work)))) return false;
  unstage(out, work);
  return true;
}

}  // namespace tdist::detail

#pragma once

// Note [Direct collectives]: for large messages on small communicators (one node), the MPI
// backend runs all_reduce, reduce_scatter_tensor and all_gather_into_tensor itself, as
// point-to-point exchanges on a private duplicate of the group's communicator, instead of
// through OpenMPI's non-blocking collectives (libnbc). libnbc's Iallreduce for in-place
// buffers, and its Ireduce_scatter_block always, reduce everything at one root and send it
// back: at world 2 that moves the whole buffer twice. The direct algorithms move each byte
// once: every rank posts MPI_Isend of chunk j to rank j and MPI_Irecv of its own chunk
// from every peer at once (vader copies large messages in one step, CMA), then reduces the
// received chunks into its own with ATen (fp32 for half/bfloat16, as staged by the caller).
// all_reduce = that reduce-scatter, then an all-gather of the reduced chunks (two stages).
// Each op uses its own tags (the per-communicator sequence number of direct ops, taken
// when the op starts on the executor thread, i.e. in issue order), so stages of
// different ops in flight never match each other's messages. Receive buffers come from a
// pool, so steady-state ops allocate (and page-fault) nothing.

#include <mpi.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "mpi/executor.h"
#include "tdist/comm/types.h"

namespace tdist::mpi::detail {

/// out = a (op) b, elementwise (SUM/AVG add, PRODUCT, MIN, MAX); out may alias a or b.
void reduce_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ReduceOp op);

/// Whether reduce_out applies `op` to `dtype` (SUM, AVG, PRODUCT, MIN, MAX on non-bool
/// dtypes): the collectives that reduce through it fall back to MPI's own otherwise.
bool reduce_out_supports(at::ScalarType dtype, ReduceOp op);

/// Scratch buffers reused across ops; used only on the executor thread.
class ScratchPool {
 public:
  /// A 1-D uint8 buffer of at least `bytes`; give it back with put().
  at::Tensor take(int64_t bytes);
  void put(at::Tensor buffer);

 private:
  std::multimap<int64_t, at::Tensor> free_;
  int64_t held_bytes_ = 0;
};

/// Everything a direct op needs about its communicator.
struct DirectComm {
  MPI_Comm comm = MPI_COMM_NULL;  // the private duplicate
  int rank = 0;
  int size = 1;
  std::shared_ptr<ScratchPool> pool;
  /// Direct ops started on this communicator: the same count on every member, because ops
  /// start in issue order on the executor thread.
  std::shared_ptr<uint32_t> sequence;
};

/// The base tag of the next direct op (two tags per op: all_reduce has two stages; below
/// MPI's guaranteed MPI_TAG_UB of 32767). Executor thread only, when the op starts.
int take_tag(const DirectComm& c);

/// True when the direct algorithm should run: world > 1, at most kDirectMaxRanks ranks,
/// at least `min_bytes` (MPIEnvironment::direct_min_bytes; -1 disables) bytes, and a reduce
/// op ATen can apply in place (SUM, AVG, PRODUCT, MIN, MAX on non-bool dtypes).
bool use_direct(int64_t min_bytes, int size, int64_t bytes, at::ScalarType dtype, bool reduces,
                ReduceOp op);

/// `out` (contiguous, numel*size == in.numel()) = this rank's chunk of `in` reduced over
/// all ranks. `finally` runs on completion (AVG division, copy-back).
StartedOp direct_reduce_scatter(const DirectComm& c, at::Tensor in, at::Tensor out, ReduceOp op,
                                int tag, std::function<void()> finally);

/// `out` (contiguous, numel == in.numel()*size) = every rank's `in`, in rank order.
StartedOp direct_all_gather(const DirectComm& c, at::Tensor in, at::Tensor out, int tag,
                            std::function<void()> finally);

/// `buffer` (contiguous) reduced over all ranks in place: reduce-scatter of its chunks,
/// then all-gather (a second stage, tag + 1).
StartedOp direct_all_reduce(const DirectComm& c, at::Tensor buffer, ReduceOp op, int tag,
                            std::function<void()> finally);

}  // namespace tdist::mpi::detail

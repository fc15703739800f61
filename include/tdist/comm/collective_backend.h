#pragma once

// The interface every communication engine implements (Gloo, MPI, NCCL, third parties).
// As c10d's Backend: each collective has a default body that throws
// "backend X does not support Y", so an engine overrides only what it has.
// Ranks and roots here are ranks *within this backend's group*.

#include <any>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/comm/types.h"
#include "tdist/comm/work.h"

namespace tdist {

class CollectiveBackend;
using CollectiveBackendPtr = std::shared_ptr<CollectiveBackend>;

class CollectiveBackend {
 public:
  CollectiveBackend(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~CollectiveBackend() = default;
  CollectiveBackend(const CollectiveBackend&) = delete;
  CollectiveBackend& operator=(const CollectiveBackend&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// Lower-case backend name ("gloo", "mpi", ...), used in error messages.
  virtual std::string name() const = 0;

  virtual WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts);
  virtual WorkPtr all_reduce(at::Tensor& tensor, const AllreduceOptions& opts);
  /// Reduces several tensors in one collective (DDP buckets, FSDP gradient groups).
  virtual WorkPtr all_reduce_coalesced(std::vector<at::Tensor>& tensors,
                                       const AllreduceOptions& opts);
  virtual WorkPtr reduce(at::Tensor& tensor, const ReduceOptions& opts);
  virtual WorkPtr all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                             const AllgatherOptions& opts);
  /// output is size() copies of input's shape concatenated along dim 0.
  virtual WorkPtr all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                                         const AllgatherOptions& opts);
  /// Note [Placed all-gather] (tdist/detail/comm/placed_all_gather.h): all_gather_into_tensor that
  /// hands each rank's block to `place` instead of writing one output tensor. Backends that
  /// have it say so in supports_all_gather_placed().
  using BlockPlacer = std::function<void(int rank, const char* block)>;
  virtual bool supports_all_gather_placed() const { return false; }
  virtual WorkPtr all_gather_placed(const at::Tensor& input, BlockPlacer place,
                                    const AllgatherOptions& opts);
  virtual WorkPtr gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                         const GatherOptions& opts);
  virtual WorkPtr scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                          const ScatterOptions& opts);
  virtual WorkPtr reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                 const ReduceScatterOptions& opts);
  /// input is size() chunks along dim 0; this rank receives the reduction of its chunk.
  virtual WorkPtr reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                                        const ReduceScatterOptions& opts);
  virtual WorkPtr all_to_all(std::vector<at::Tensor>& outputs,
                             const std::vector<at::Tensor>& inputs, const AllToAllOptions& opts);
  /// Empty split sizes mean equal splits along dim 0.
  virtual WorkPtr all_to_all_single(at::Tensor& output, const at::Tensor& input,
                                    const std::vector<int64_t>& output_split_sizes,
                                    const std::vector<int64_t>& input_split_sizes,
                                    const AllToAllOptions& opts);
  virtual WorkPtr barrier(const BarrierOptions& opts);
  virtual WorkPtr send(const at::Tensor& tensor, int dst, const SendRecvOptions& opts);
  virtual WorkPtr recv(at::Tensor& tensor, int src, const SendRecvOptions& opts);
  /// A receive from whichever rank sends first (c10d's recvAnysource): the Work's
  /// source_rank() names the sender once it has completed.
  virtual WorkPtr recv_anysource(at::Tensor& tensor, const SendRecvOptions& opts);
  /// Several sends and receives issued together (torch.distributed.batch_isend_irecv);
  /// NCCL runs them as one group call. Default: each through send()/recv(), one Work that
  /// completes when all have.
  virtual WorkPtr batch_send_recv(std::vector<PointToPoint>& ops, const CollectiveOptions& opts);

  /// Whether tensors of `type` go to this backend as they are. Tensors of a device type it
  /// does not take (CUDA tensors on gloo, say) are staged through pinned host memory by the
  /// process group (Note [Staging device tensors through the host]).
  virtual bool takes_device_tensors(c10::DeviceType type) const { return type == c10::kCPU; }

  /// Whether all_reduce, reduce and reduce_scatter take ReduceOp PREMUL_SUM themselves
  /// (NCCL); for the others the process group scales the input and sends SUM (Note
  /// [PREMUL_SUM without NCCL]).
  virtual bool supports_premul_sum() const { return false; }

  /// Whether split() makes a split group's backend from this one (NCCL's ncclCommSplit);
  /// otherwise split_group creates a fresh backend among the new group's ranks.
  virtual bool supports_splitting() const { return false; }
  /// Collective over every rank of this backend's group: this rank joins the new group of
  /// `ranks` (ranks of this group, sorted), or none when `ranks` is empty (then it returns
  /// null). `color` is the same on every rank of one new group and differs between groups.
  /// `pg_options` is the backend's own options type, or empty for the parent's.
  virtual CollectiveBackendPtr split(const std::vector<int>& ranks, int color,
                                     std::chrono::milliseconds timeout, const std::any& pg_options);
  /// Whether shrink() makes a shrunk group's backend from this one (NCCL's ncclCommShrink);
  /// otherwise shrink_group creates a fresh backend among the remaining ranks.
  virtual bool supports_shrinking() const { return false; }
  /// Collective over the ranks of this group not in `excluded` (sorted ranks of this group,
  /// which take no part): a backend of the remaining ranks, renumbered in order. `flags` as
  /// shrink_group's.
  virtual CollectiveBackendPtr shrink(const std::vector<int>& excluded, int flags,
                                      std::chrono::milliseconds timeout,
                                      const std::any& pg_options);

  /// Makes every operation of this backend that is waiting now, and every later one, fail
  /// with DistBackendError naming `reason` (c10d's ProcessGroup::abort): what a rank does
  /// when it learns that a peer is gone (Note [Aborting on a lost peer]). Returns false when
  /// this backend cannot interrupt an operation already waiting; it is then only marked
  /// broken, which is the default.
  virtual bool abort(const std::string& reason);

  /// Marks the backend unusable after a fatal error (dead peer, timeout): every later call
  /// fails at once with `reason` instead of computing on corrupt state.
  void mark_broken(const std::string& reason);
  bool is_broken() const;
  std::string broken_reason() const;

 protected:
  [[noreturn]] void throw_unsupported(const std::string& op) const;
  /// Throws DistBackendError if mark_broken() was called.
  void check_not_broken(const std::string& op) const;

  int rank_;
  int size_;

 private:
  mutable std::mutex broken_mutex_;
  std::string broken_reason_;
};

}  // namespace tdist

#pragma once

// The MPI backend (OpenMPI), registered as "mpi" through Backend::register_backend, the
// same door a third-party backend uses. Every collective of SPEC's table, reduce_scatter
// included (PyTorch's MPI backend has none), bf16/fp16 reduced in fp32.
//
// Note [MPI progress]: MPI is initialised with MPI_THREAD_SERIALIZED and driven by one
// executor thread per process, shared by every MPI group. Each op is started as a
// non-blocking MPI call (MPI_Iallreduce, MPI_Isend, ...) in issue order — the same order on
// every rank, which MPI requires — and the executor polls the outstanding requests. The
// collectives of one communicator start one at a time (so ops on one tensor see each other's
// results; Note [One op per lane] in src/mpi/executor.cpp), while other communicators'
// collectives and isend/irecv stay in flight together (isend/irecv pairs never deadlock), and
// a request past its deadline fails its Work with TimeoutError instead of blocking the process.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tdist/comm/collective_backend.h"
#include "tdist/store/store.h"

namespace tdist::mpi {

namespace detail {
struct Communicator;
}

class MPIBackend : public CollectiveBackend {
 public:
  /// Creates the backend for a group of `size` processes in which this one is `rank`.
  /// Members exchange their MPI world ranks through `store` (a group-private store);
  /// with a null store the group must be the whole MPI world in MPI rank order.
  MPIBackend(const StorePtr& store, int rank, int size, std::chrono::milliseconds timeout);
  ~MPIBackend() override;

  std::string name() const override { return "mpi"; }

  WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts) override;
  WorkPtr all_reduce(at::Tensor& tensor, const AllreduceOptions& opts) override;
  WorkPtr all_reduce_coalesced(std::vector<at::Tensor>& tensors,
                               const AllreduceOptions& opts) override;
  WorkPtr reduce(at::Tensor& tensor, const ReduceOptions& opts) override;
  WorkPtr all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                     const AllgatherOptions& opts) override;
  WorkPtr all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                                 const AllgatherOptions& opts) override;
  bool supports_all_gather_placed() const override { return true; }
  WorkPtr all_gather_placed(const at::Tensor& input, BlockPlacer place,
                            const AllgatherOptions& opts) override;
  WorkPtr gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                 const GatherOptions& opts) override;
  WorkPtr scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                  const ScatterOptions& opts) override;
  WorkPtr reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                         const ReduceScatterOptions& opts) override;
  WorkPtr reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                                const ReduceScatterOptions& opts) override;
  WorkPtr all_to_all(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                     const AllToAllOptions& opts) override;
  WorkPtr all_to_all_single(at::Tensor& output, const at::Tensor& input,
                            const std::vector<int64_t>& output_split_sizes,
                            const std::vector<int64_t>& input_split_sizes,
                            const AllToAllOptions& opts) override;
  WorkPtr barrier(const BarrierOptions& opts) override;
  WorkPtr send(const at::Tensor& tensor, int dst, const SendRecvOptions& opts) override;
  WorkPtr recv(at::Tensor& tensor, int src, const SendRecvOptions& opts) override;
  /// MPI_Irecv from MPI_ANY_SOURCE; the status names the sender.
  WorkPtr recv_anysource(at::Tensor& tensor, const SendRecvOptions& opts) override;

 private:
  std::chrono::milliseconds deadline_for(const CollectiveOptions& opts) const;
  // all_gather_into_tensor off shared memory: `in` gathered rank-major into `out` (both
  // contiguous), then `finally` on the executor thread before the Work completes.
  WorkPtr gather_off_shm(const at::Tensor& in, const at::Tensor& out,
                         std::vector<at::Tensor> outputs, std::function<void()> finally,
                         const AllgatherOptions& opts);
  std::unique_ptr<detail::Communicator> comm_;
  std::chrono::milliseconds timeout_;
};

/// Registers "mpi" for device "cpu" (idempotent). Runs automatically in every program that
/// links tdist::tdist; call it yourself only when linking tdist_mpi directly.
void register_mpi_backend();

/// True when this process was started by mpirun/mpiexec (its environment says so).
bool launched_by_mpirun();

/// Throws InvalidArgument naming the fix (`tdistrun --launcher mpirun`, or mpirun itself)
/// when a group of more than one rank is asked for in a process that mpirun did not start
/// (e.g. forked by a plain tdistrun).
void check_mpi_launch(int rank, int size);

/// The rank and size of this process in MPI_COMM_WORLD (initialises MPI if needed).
int world_rank();
int world_size();

/// A store for the job, bootstrapped over MPI: rank 0 hosts a TCPStore on a free port of
/// its host name and broadcasts host:port with MPI_Bcast. Lets init_process_group("mpi")
/// work under mpirun with no MASTER_ADDR/MASTER_PORT.
StorePtr bootstrap_store(std::chrono::milliseconds timeout);

}  // namespace tdist::mpi

#pragma once

// Which launcher started this process, and what its environment says about the job: rank,
// world size, the rank on this node, and where rank 0's store listens.
// init_process_group() with nothing given reads it, so a program started by srun, a
// Kubeflow PyTorchJob, mpirun / mpiexec or tdistrun needs no flags (docs/launcher.md,
// "Other launchers").
//
// Note [Launch environment precedence]
// Sources, first match wins:
//   1. torchrun / tdistrun: RANK (with WORLD_SIZE; LOCAL_RANK, LOCAL_WORLD_SIZE). A Kubeflow
//      PyTorchJob's containers get these too.
//   2. An MPI launcher: OpenMPI (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE),
//      MPICH's Hydra (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS), PMIx launchers
//      (PMIX_RANK, the size from SLURM or WORLD_SIZE).
//   3. SLURM's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_TASKS_PER_NODE at
//      SLURM_NODEID; rank 0's host is the first of SLURM_STEP_NODELIST (else
//      SLURM_JOB_NODELIST, else SLURM_NODELIST), the port 20000 + SLURM_JOB_ID % 20000.
//   4. Kubeflow's elastic variables for one process per pod: PET_NODE_RANK, PET_NNODES,
//      PET_MASTER_ADDR, PET_MASTER_PORT.
// Where every rank is on this host, the port comes from what the ranks share and no other job
// has: OpenMPI's job id, the PMIx namespace, or (MPICH's Hydra exports neither) the process
// id of the hydra_pmi_proxy that started them all.
// MASTER_ADDR and MASTER_PORT, when set, override what a source derives. A source that
// disagrees with another one describing the same job is an error naming both: an MPI rank
// unlike SLURM_PROCID in a job of SLURM_NTASKS processes (srun --mpi=...), WORLD_SIZE unlike
// the launcher's size, two MPI families' ranks that differ. An MPI job whose size differs
// from SLURM_NTASKS is mpirun inside an allocation: the MPI launcher's numbers are used.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tdist {

struct LaunchEnvironment {
  /// "torchrun", "openmpi", "mpich", "pmix", "slurm", "kubeflow"; empty when no launcher's
  /// variables were found.
  std::string launcher;
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;        ///< -1: unknown
  int local_world_size = -1;  ///< -1: unknown
  std::string master_addr;    ///< empty: unknown
  int master_port = -1;       ///< -1: unknown
  /// How each value was found ("SLURM_PROCID=3", "first host of SLURM_JOB_NODELIST=..."), for
  /// the debug line and errors.
  std::vector<std::string> provenance;

  /// Reads the environment through `getenv` (the process's by default). Throws
  /// InvalidArgument naming the variables when they cannot be parsed or two sources
  /// disagree. `hydra_proxy_pid`: the process id of the MPICH Hydra proxy that started this
  /// process, 0 when its parent is none (by default: looked up when reading the process's own
  /// environment, 0 otherwise).
  static LaunchEnvironment detect(const std::function<const char*(const char*)>& getenv = nullptr,
                                  std::optional<int64_t> hydra_proxy_pid = std::nullopt);

  bool found() const { return !launcher.empty(); }

  /// Sets the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
  /// MASTER_ADDR, MASTER_PORT) that are unset and known here, so that every reader of the
  /// torchrun convention sees this launch; returns the names it set.
  std::vector<std::string> export_torchrun_variables() const;

  /// One line: the launcher and where each value came from.
  std::string describe() const;
};

/// SLURM's compressed host list: "node[01-04,07],gpu3" -> node01 node02 node03 node04
/// node07 gpu3 (zero padding kept). Throws InvalidArgument naming `list` when malformed.
std::vector<std::string> expand_slurm_hostlist(const std::string& list);

/// SLURM_TASKS_PER_NODE's compressed counts: "2(x3),1" -> 2 2 2 1.
std::vector<int> expand_slurm_tasks_per_node(const std::string& counts);

}  // namespace tdist

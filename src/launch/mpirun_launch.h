#pragma once

// tdistrun --launcher mpirun (internal).
//
// Note [Workers through mpirun]: processes forked one by one each initialise MPI as a
// singleton, and OpenMPI singletons cannot join one world. With --launcher mpirun the agent
// starts ONE child per attempt:
//
//   mpirun -n <nproc> --oversubscribe --bind-to none [--mpirun-args]
//          <tdistrun> --mpi-worker-shim <program> <args...>
//
// Every process mpirun starts is a small shim (tdistrun itself, in shim mode). It reads its
// MPI rank (OMPI_COMM_WORLD_RANK) and the spec the agent wrote for that local rank (the
// worker's complete torchrun environment, output routing and log paths), then runs the
// program as the forked launcher would (WorkerGroup: own process group, "[rank N]: "
// prefixes, per-rank logs, SIGTERM forwarding). The program inherits mpirun's OMPI_*/PMIX_*
// variables, so MPI_Init joins the world of the mpirun. When the program fails, the shim
// records the failure (time, rank, pid, exit code, last lines) in the attempt's directory
// before exiting; mpirun then ends the other ranks and exits non-zero, and the agent
// summarises the earliest recorded failure exactly like a forked worker's, then restarts
// (a fresh mpirun) up to --max-restarts.

#include <optional>
#include <string>
#include <vector>

#include "tdist/launch/launch_config.h"
#include "tdist/launch/worker_group.h"

namespace tdist::launch::detail {

/// argv[1] of tdistrun that makes it the per-rank shim under mpirun (internal).
inline constexpr const char* kMpiWorkerShimFlag = "--mpi-worker-shim";
/// Environment variable naming the attempt's spec directory (set on mpirun's environment).
inline constexpr const char* kMpiSpecDirEnv = "TDISTRUN_MPI_SPEC_DIR";

/// How to start one attempt's mpirun: its path, its arguments, and its WorkerSpec (the
/// mpirun process's own environment and output routing).
struct MpirunPlan {
  std::string program;
  std::vector<std::string> args;
  WorkerSpec spec;
};

/// Writes one spec file per worker into `dir` (created, 0700) and returns how to start the
/// mpirun. `mpirun_env` is mpirun's environment ("KEY=value"); `program` is resolved.
MpirunPlan plan_mpirun(const LaunchConfig& config, const std::vector<WorkerSpec>& workers,
                       const std::string& program, const std::string& dir,
                       std::vector<std::string> mpirun_env);

/// The earliest failure a shim recorded in `dir` (nullopt: none, e.g. mpirun itself failed).
std::optional<WorkerStatus> first_recorded_failure(const std::string& dir);

/// main() of the shim: argv[0] is the program, the rest its arguments.
int mpi_worker_shim_main(int argc, const char* const* argv);

}  // namespace tdist::launch::detail

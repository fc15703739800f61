#pragma once

// When gpt is started by hand (no RANK in the environment) with --nproc N > 1, it starts N
// copies of itself as ranks 0..N-1 on this machine, as tdistrun would: same arguments,
// RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT set.
// If a rank fails, the others are stopped and its exit code is returned.

#include <string>
#include <vector>

namespace gpt {

/// Whether a launcher started this process as one rank of a job: RANK is set (tdistrun,
/// torchrun, our spawner), or srun's, mpirun's or a Kubeflow PyTorchJob's variables say so,
/// and then the torchrun variables they imply are set here (tdist::LaunchEnvironment).
bool adopt_launch_environment();

/// Runs `argv` (argv[0] ignored: this executable is re-run) as nproc ranks and waits.
/// Returns 0 when every rank succeeded, else the first failing rank's exit code (128+signal
/// for a signal).
int spawn_local_ranks(int nproc, const std::vector<std::string>& argv);

}  // namespace gpt

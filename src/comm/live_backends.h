#pragma once

// Internal: the backends of this process's groups, for aborting them all at once.
//
// Note [Aborting on a lost peer]
// When heartbeats (Note [Heartbeats]) declare a peer lost, the collectives waiting on it
// would otherwise wait for their timeout. Every backend made by init_process_group,
// new_group and the splits is tracked here (weakly: a destroyed group drops out), and on a
// loss each is aborted with the loss as the reason (CollectiveBackend::abort): an operation
// waiting on any peer fails at once, and every later one fails before it starts, each with
// DistBackendError naming the lost rank and its host. The whole group fails, not just the
// operations that involve the lost rank, as in c10d's abort: the survivors' next collectives
// would wait on ranks that are themselves aborting. Gloo's closes its connections, NCCL's
// aborts its communicator. A backend that cannot interrupt an operation already waiting
// (abort() returns false: MPI's, a third party's) leaves no way to
// raise the loss, so the process ends as before (exit code 75).

#include <string>

#include "tdist/comm/collective_backend.h"

namespace tdist::detail {

/// Remembers `backend` until it is destroyed. Thread-safe.
void track_live_backend(const CollectiveBackendPtr& backend);

/// abort(reason) on every live tracked backend; false when one of them could not interrupt
/// operations in flight. Thread-safe (the heartbeat thread calls it).
bool abort_live_backends(const std::string& reason);

/// Whether abort_live_backends ran in this process: a peer is known lost, so the failure
/// paths skip what would wait on it (the flight recorder's report, the exit barrier's wait).
bool live_backends_aborted();

/// A new world starts without a loss (init_process_group after one was handled).
void forget_abort();

}  // namespace tdist::detail

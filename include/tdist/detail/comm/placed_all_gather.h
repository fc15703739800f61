#pragma once

// Note [Placed all-gather]: all_gather_into_tensor for a caller that does not want the rank
// blocks side by side. FSDP gathers every parameter's shard in one collective, but each
// parameter's unsharded tensor is its rows from every rank, so a rank-major output has to be
// copied out into the parameter-major block afterwards: every gathered byte copied twice,
// both times through memory the module's compute just evicted (bench/HISTORY.md).
// Here each rank's block (this rank's own included) is handed to `place` as soon as it is
// readable, on the thread running the collective and before the returned Work completes, so
// the caller copies it once, straight where it belongs. On the Gloo engine with the input in
// symmetric memory, `place` reads the peers' inputs where they live; otherwise the blocks come
// from the engine's staging or a gathered scratch buffer. Every rank must call it where the
// others call all_gather_into_tensor or it (the same collective on the wire).

#include <ATen/core/Tensor.h>

#include "tdist/comm/collective_backend.h"
#include "tdist/comm/process_group.h"
#include "tdist/comm/work.h"

namespace tdist {

/// Whether `group`'s backend for `input`'s device has the placed path.
bool supports_all_gather_placed(const at::Tensor& input, const ProcessGroupPtr& group);

/// Gathers `input` (contiguous, the same numel on every rank) from every rank of `group` and
/// calls place(rank, block) once per rank with that rank's `input.nbytes()` bytes, in any
/// order, before the returned Work (always async) completes; `place` must not throw, and the
/// block is valid only during the call. Raises InvalidArgument when the backend has no such
/// path (ask supports_all_gather_placed first).
WorkPtr all_gather_placed(const at::Tensor& input, CollectiveBackend::BlockPlacer place,
                          const ProcessGroupPtr& group);

}  // namespace tdist

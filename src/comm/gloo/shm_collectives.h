#pragma once

// all_reduce, all_gather_into_tensor and reduce_scatter_tensor over the same-host
// shared-memory arena (Note [Shared-memory path] in shm.h). Each runs the header handshake
// itself (announcing its segment), so callers do not.

#include <ATen/core/Tensor.h>

#include "comm/gloo/exchange.h"
#include "comm/gloo/shm.h"
#include "tdist/comm/types.h"

namespace tdist::detail {

/// In place; any dtype/layout the Gloo engine takes (reduced in the accumulation dtype).
void shm_all_reduce(Exchange& ex, ShmArena& arena, at::Tensor& tensor, ReduceOp op);
/// output holds world_size x input elements, rank c's input at block c.
void shm_all_gather(Exchange& ex, ShmArena& arena, at::Tensor& output, const at::Tensor& input);
/// input holds world_size x output elements; output gets the reduction of block `rank`.
void shm_reduce_scatter(Exchange& ex, ShmArena& arena, at::Tensor& output, const at::Tensor& input,
                        ReduceOp op);

}  // namespace tdist::detail

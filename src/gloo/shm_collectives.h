#pragma once

// all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast and even-split
// all_to_all_single over the same-host arena (Note [Shared-memory path] in shm.h), run by the
// same-host engine (tdist/detail/comm/engine/same_host.h) through a GlooSameHostChannel. Each runs
// the header handshake itself (announcing its segment), so callers do not. Each returns true
// when done, or false when some rank could not get shared memory for it (Note [Falling back
// to TCP] in same_host_channel.cpp): the handshake has run, and the caller moves the data
// over TCP.

#include <vector>

#include <ATen/core/Tensor.h>

#include "gloo/exchange.h"
#include "gloo/shm.h"
#include "tdist/comm/collective_backend.h"
#include "tdist/comm/types.h"

namespace tdist::detail {

/// In place; any dtype/layout the Gloo engine takes (reduced in the accumulation dtype).
bool shm_all_reduce(Exchange& ex, ShmArena& arena, at::Tensor& tensor, ReduceOp op);
/// output holds world_size x input elements, rank c's input at block c.
bool shm_all_gather(Exchange& ex, ShmArena& arena, at::Tensor& output, const at::Tensor& input);
/// Note [Placed all-gather]: place(c, block) for every rank c's input, read where it is.
bool shm_all_gather_placed(Exchange& ex, ShmArena& arena, const at::Tensor& input,
                           const CollectiveBackend::BlockPlacer& place);
/// input holds world_size x output elements; output gets the reduction of block `rank`.
bool shm_reduce_scatter(Exchange& ex, ShmArena& arena, at::Tensor& output, const at::Tensor& input,
                        ReduceOp op);

/// The root's tensor to every rank.
bool shm_broadcast(Exchange& ex, ShmArena& arena, at::Tensor& tensor, int root);
/// all_to_all_single with even splits: block p of input goes to rank p, block c of output
/// comes from rank c. `send`/`recv` are the per-peer bytes, for the handshake's pairwise check.
bool shm_all_to_all(Exchange& ex, ShmArena& arena, at::Tensor& output, const at::Tensor& input,
                    const std::vector<int64_t>& send, const std::vector<int64_t>& recv);

}  // namespace tdist::detail

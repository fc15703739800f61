#pragma once

// all_reduce, reduce_scatter_tensor and all_gather_into_tensor on tensors in symmetric memory
// (include/tdist/comm/symmetric_memory.h) over the same-host arena: peers read each other's
// tensors directly instead of staging copies (Note [Symmetric path] in the .cpp).

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "gloo/exchange.h"
#include "gloo/shm.h"
#include "tdist/comm/collective_backend.h"
#include "tdist/comm/engine/symmetric_registry.h"
#include "tdist/comm/types.h"

namespace tdist::detail {

/// Where `t` lies in symmetric memory when it can take the symmetric path as it is (non-empty,
/// contiguous, already in the dtype the reduction accumulates in), else id 0.
SymmetricRef symmetric_ref(const at::Tensor& t, at::ScalarType accumulate);

/// Raises DistBackendError on every rank when some ranks announced a symmetric tensor and
/// others did not (`headers` from the handshake; `mine` what this rank announced).
void check_symmetric_agreement(const Exchange& ex, const std::vector<Header>& headers, bool mine);

void symmetric_all_reduce(Exchange& ex, ShmArena& arena, at::Tensor& tensor, ReduceOp op,
                          SymmetricRef ref);
/// `ref`: the input's place in symmetric memory.
void symmetric_reduce_scatter(Exchange& ex, ShmArena& arena, at::Tensor& output,
                              const at::Tensor& input, ReduceOp op, SymmetricRef ref);
/// `ref`: where this rank's block lies in symmetric memory, its input or block rank of its
/// output (what peers read).
void symmetric_all_gather(Exchange& ex, ShmArena& arena, at::Tensor& output,
                          const at::Tensor& input, SymmetricRef ref);
/// Note [Placed all-gather]: place(c, rank c's input) for every rank, read where it lives.
void symmetric_all_gather_placed(Exchange& ex, ShmArena& arena, const at::Tensor& input,
                                 SymmetricRef ref, const CollectiveBackend::BlockPlacer& place);

}  // namespace tdist::detail

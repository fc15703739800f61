#pragma once

// Fault injection for save (tests): see FaultInjection in checkpoint.h.

#include "tdist/checkpoint/checkpoint.h"

namespace tdist::checkpoint::detail {

/// options' fault, or the one TDIST_CHECKPOINT_FAULT describes (the environment wins).
FaultInjection resolve_fault(const FaultInjection& from_options);

/// Throws CheckpointError or SIGKILLs this process when `fault` is for (rank, phase).
void maybe_inject(const FaultInjection& fault, int rank, SavePhase phase);

}  // namespace tdist::checkpoint::detail

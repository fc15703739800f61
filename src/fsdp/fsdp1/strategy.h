#pragma once

// What each FSDP1 ShardingStrategy means on the fully_shard core, for the FSDP1 sources.

#include <string>

#include "tdist/fsdp/fully_sharded_data_parallel.h"

namespace tdist::fsdp::detail {

std::string strategy_name(ShardingStrategy s);

/// "FullyShardedDataParallel(<strategy>) on rank <r>: ", the start of every FSDP1 error.
std::string where(ShardingStrategy s);

/// FULL_SHARD and HYBRID_SHARD free the parameters after forward (reshard_after_forward).
bool reshards_after_forward(ShardingStrategy s);

/// Strategies of one family shard over the same kind of mesh: 1-D (FULL_SHARD,
/// SHARD_GRAD_OP), 2-D hybrid (HYBRID_SHARD, HYBRID_SHARD_ZERO2), or replicate-only (NO_SHARD).
int strategy_family(ShardingStrategy s);

}  // namespace tdist::fsdp::detail

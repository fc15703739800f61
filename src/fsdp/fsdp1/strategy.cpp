#include "fsdp/fsdp1/strategy.h"

#include "tdist/comm/distributed.h"

namespace tdist::fsdp::detail {

std::string strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FULL_SHARD:
      return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP:
      return "SHARD_GRAD_OP";
    case ShardingStrategy::NO_SHARD:
      return "NO_SHARD";
    case ShardingStrategy::HYBRID_SHARD:
      return "HYBRID_SHARD";
    case ShardingStrategy::HYBRID_SHARD_ZERO2:
      return "HYBRID_SHARD_ZERO2";
  }
  return "?";
}

std::string where(ShardingStrategy s) {
  return "FullyShardedDataParallel(" + strategy_name(s) + ") on rank " +
         std::to_string(get_rank()) + ": ";
}

bool reshards_after_forward(ShardingStrategy s) {
  return s == ShardingStrategy::FULL_SHARD || s == ShardingStrategy::HYBRID_SHARD;
}

int strategy_family(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FULL_SHARD:
    case ShardingStrategy::SHARD_GRAD_OP:
      return 0;
    case ShardingStrategy::HYBRID_SHARD:
    case ShardingStrategy::HYBRID_SHARD_ZERO2:
      return 1;
    case ShardingStrategy::NO_SHARD:
      return 2;
  }
  return -1;
}

}  // namespace tdist::fsdp::detail

#pragma once

// Note [Same model on every rank]: FSDP's collectives take their sizes and dtypes from each
// rank's own parameters and options, so ranks that built different models (a config read
// differently, a layer added on one rank) or passed different options would issue
// collectives that do not match: Gloo reports that late, as a mismatch of anonymous
// collectives, and NCCL may hang or corrupt the parameters. So each fully_shard call that
// manages parameters first compares, over the group it shards over and (HSDP) the group it
// replicates over, the module's type, every parameter it manages (name, shape, dtype, whether
// it trains) and the options that decide its collectives, and raises on every rank naming
// the first difference and the ranks, before any collective of its own. One small all-gather per group and call,
// as DDP's construction does for the whole model. A call without parameters communicates
// nothing, now or later, so it compares nothing either (and stays local: a rank may shard
// a parameterless module while a peer is still busy in the previous step's collectives).

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/comm/process_group.h"
#include "tdist/fsdp/policies.h"

namespace tdist::fsdp::detail {

/// What one fully_shard call manages, one line each (what the ranks compare); `shard_dims`:
/// per parameter, shard_placement_fn's dim.
std::vector<std::string> describe_fully_shard_call(
    const std::string& module_type, const std::vector<std::pair<std::string, at::Tensor>>& params,
    const std::vector<int64_t>& shard_dims, const FullyShardOptions& options);

/// Collective over each group (null ones and one-rank groups skipped), in order. Throws
/// InvalidArgument on every rank when some rank described its call differently.
void verify_same_call_on_every_rank(const std::vector<std::string>& description,
                                    const std::vector<ProcessGroupPtr>& groups);

}  // namespace tdist::fsdp::detail

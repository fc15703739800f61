#include "fsdp/group_buffers.h"

#include "fsdp/per_call_buffers.h"
#include "fsdp/persistent_buffers.h"

namespace tdist::fsdp::detail {

// Note [Persistent buffers] (flat_collectives.h): fully_shard decides which groups take that path
// (plain CPU groups computed and reduced in the parameters' own dtype, unless
// TDIST_FSDP_PERSISTENT_BUFFERS=0) and builds their flat shard in place; a group without one
// takes the general path.
std::unique_ptr<GroupBuffers> make_group_buffers(const GroupBuffersContext& context,
                                                 GroupConfig& config) {
  if (!config.flat_shard.defined()) return std::make_unique<PerCallBuffers>(context);
  at::Tensor flat_shard = std::move(config.flat_shard);
  config.flat_shard = at::Tensor();
  return std::make_unique<PersistentBuffers>(context, std::move(flat_shard),
                                             config.symmetric_buffers, config.placed_all_gather);
}

}  // namespace tdist::fsdp::detail

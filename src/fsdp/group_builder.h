#pragma once

// GroupBuilder: turns the parameters one fully_shard call manages into a ParamGroup, one
// parameter at a time. fully_shard shards them all at once; deferred init (materialize)
// shards each as soon as its module's full values exist, so that a rank never holds more
// than its shards plus one module's full parameters (Note [Deferred init]).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "fsdp/environment.h"
#include "fsdp/param_group.h"
#include "fsdp/sharded_param.h"
#include "tdist/comm/process_group.h"

namespace tdist::fsdp::detail {

/// Everything fully_shard decides about a group before any parameter holds data to shard.
struct GroupPlan {
  std::vector<std::pair<std::string, at::Tensor>> params;  // (name in the group, parameter)
  std::vector<int64_t> shard_dims;  // per parameter (Note [Sharding on another dim]); empty: 0
  ProcessGroupPtr group;                                   // the ranks sharding them
  GroupConfig config;
  ParamPolicy policy;
};

class GroupBuilder {
 public:
  /// `device`: where the parameters hold their full data when shard() is called.
  GroupBuilder(GroupPlan plan, c10::Device device);

  size_t size() const { return plan_.params.size(); }
  const at::Tensor& param(size_t i) const { return plan_.params[i].second; }
  /// Shards parameter i, which holds its full data now (identical on every rank). The first
  /// call allocates the group's flat shard, a collective (Note [Persistent buffers]): every
  /// rank builds its groups in the same order.
  void shard(size_t i);
  /// Shards parameter i, still a meta tensor, by writing this rank's rows straight into its
  /// shard (deferred init's loader); the same collective first call as shard().
  void shard_in_place(size_t i, const ShardedParam::RowsFill& fill);
  bool sharded(size_t i) const { return params_[i] != nullptr; }
  /// The group; every parameter must have been sharded.
  std::unique_ptr<ParamGroup> finish(const std::string& label);

 private:
  void allocate_flat_shard_if_eligible();
  /// Parameter i's slice of the group's flat shard (undefined without one).
  at::Tensor shard_buffer(size_t i);

  GroupPlan plan_;
  c10::Device device_;
  FSDPEnvironment environment_;  // read once per fully_shard / materialize call
  int world_;
  int rank_;
  std::vector<int64_t> offsets_;  // each parameter's padded shard in the flat shard
  int64_t total_ = 0;
  bool flat_decided_ = false;
  std::vector<std::unique_ptr<ShardedParam>> params_;
};

}  // namespace tdist::fsdp::detail

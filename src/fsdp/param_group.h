#pragma once

// ParamGroup: the parameters of one fully_shard call, communicated together (one
// all-gather into one buffer, one reduce-scatter). Owns the lifecycle; the state machine is
// written out in param_group.cpp.

#include <memory>
#include <string>
#include <vector>

#include "fsdp/collectives.h"
#include "fsdp/sharded_param.h"
#include "tdist/comm/process_group.h"
#include "tdist/fsdp/fully_shard.h"

namespace tdist::fsdp::detail {

class CommContext;

/// Where the parameters' data is (see the diagram in param_group.cpp).
enum class ShardState {
  kSharded,             // P holds its 1/N shard; unsharded storage holds 0 bytes
  kShardedPostForward,  // P holds its shard; a 1/k slab is kept for backward
  kUnsharding,          // all-gather issued, not yet waited
  kUnsharded,           // P holds the full data
};

/// Where the module is in the training step.
enum class TrainingState { kIdle, kForward, kPreBackward, kPostBackward };

const char* to_string(ShardState state);
const char* to_string(TrainingState state);

class ParamGroup {
 public:
  ParamGroup(std::string label, std::vector<std::unique_ptr<ShardedParam>> params,
             ProcessGroupPtr group, ReshardAfterForward reshard_after_forward,
             ProcessGroupPtr post_forward_group);

  const std::string& label() const { return label_; }
  void set_label(std::string label) { label_ = std::move(label); }
  ShardState shard_state() const { return shard_state_; }
  TrainingState training_state() const { return training_state_; }
  const std::vector<std::unique_ptr<ShardedParam>>& params() const { return params_; }
  void set_comm_context(CommContext* context) { comm_ = context; }
  /// The root group keeps its parameters after forward: its backward comes next.
  void set_is_root(bool is_root) { is_root_ = is_root; }
  FSDPStats& stats() { return stats_; }

  // ---- verbs (idempotent; each checks its precondition) ----
  void unshard(bool async_op);
  void wait_for_unshard();
  void reshard();

  // ---- phases, called by FSDPState's hooks ----
  void pre_forward();
  void post_forward();
  void pre_backward();
  void post_backward();
  /// Installs the gradients of a finished reduce-scatter (called via CommContext).
  void finish_reduce();
  /// End of backward: runs any post-backward that autograd did not trigger, reshards,
  /// returns to idle.
  void finalize_backward();

  size_t unsharded_bytes() const;

 private:
  void reshard_post_forward();
  void check(bool condition, const char* verb, const char* expected) const;

  std::string label_;
  std::vector<std::unique_ptr<ShardedParam>> params_;
  std::vector<ShardedParam*> raw_;
  FlatLayout flat_;
  ProcessGroupPtr group_;
  ReshardAfterForward reshard_after_forward_;
  ProcessGroupPtr post_forward_group_;  // the k-rank group of an integer reshard
  CommContext* comm_ = nullptr;
  bool is_root_ = false;

  ShardState shard_state_ = ShardState::kSharded;
  TrainingState training_state_ = TrainingState::kIdle;
  AllGatherResult all_gather_;    // valid while kUnsharding
  at::Tensor post_forward_slab_;  // valid while kShardedPostForward
  ReduceScatterResult reduce_;    // valid while a reduce-scatter is pending
  bool reduce_pending_ = false;
  FSDPStats stats_;
};

}  // namespace tdist::fsdp::detail

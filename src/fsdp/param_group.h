#pragma once

// ParamGroup: the parameters of one fully_shard call, communicated together (one
// all-gather into one buffer, one reduce-scatter). Owns the lifecycle; the state machine is
// written out in param_group.cpp. Where the buffers come from and how data moves through
// them is its GroupBuffers' business (group_buffers.h).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "fsdp/collectives.h"
#include "fsdp/comm_context.h"
#include "fsdp/group_buffers.h"
#include "fsdp/sharded_param.h"
#include "tdist/comm/process_group.h"
#include "tdist/fsdp/policies.h"

namespace tdist::fsdp::detail {

class DeviceStreams;

/// Where the parameters' data is (see the diagram in param_group.cpp).
enum class ShardState {
  kSharded,             // P holds its 1/N shard; unsharded storage holds 0 bytes
  kShardedPostForward,  // P holds its shard; a 1/k slab is kept for backward
  kUnsharding,          // all-gather issued, not yet waited
  kUnsharded,           // P holds the full data
  kUnshardedNoData,     // P has its full shape but no storage (set_unshard_in_backward(false))
  kSummoned,            // P holds the full data in the sharded dtype (summon_full_params)
};

/// Where the module is in the training step.
enum class TrainingState { kIdle, kForward, kPreBackward, kPostBackward };

const char* to_string(ShardState state);
const char* to_string(TrainingState state);

class ParamGroup {
 public:
  ParamGroup(std::string label, std::vector<std::unique_ptr<ShardedParam>> params,
             ProcessGroupPtr group, GroupConfig config);
  ~ParamGroup();
  ParamGroup(const ParamGroup&) = delete;
  ParamGroup& operator=(const ParamGroup&) = delete;

  const std::string& label() const { return labels_.module; }
  void set_label(std::string label);
  ShardState shard_state() const { return shard_state_; }
  TrainingState training_state() const { return training_state_; }
  const std::vector<std::unique_ptr<ShardedParam>>& params() const { return params_; }
  /// The root's context once the root took this group into its tree (Note [Detached
  /// context] until then).
  void set_comm_context(CommContext& context) { comm_ = &context; }
  /// The root group keeps its parameters after forward: its backward comes next.
  void set_is_root(bool is_root) { is_root_ = is_root; }
  FSDPStats& stats() { return stats_; }
  /// The group parameters are sharded over / replicated across (null without HSDP).
  const ProcessGroupPtr& shard_group() const { return group_; }
  const ProcessGroupPtr& replicate_group() const { return config_.replicate_group; }
  void set_requires_gradient_sync(bool sync) { requires_gradient_sync_ = sync; }
  /// FSDPModule::set_reshard_after_forward: between steps only.
  void set_reshard_after_forward(bool reshard);
  /// FSDPModule::set_gradient_divide_factor; nullopt: the data-parallel size.
  void set_gradient_divide_factor(std::optional<double> factor);
  /// FSDPModule::set_requires_all_reduce.
  void set_requires_all_reduce(bool all_reduce) { requires_all_reduce_ = all_reduce; }
  /// FSDPModule::set_all_reduce_hook / set_unshard_in_backward.
  void set_all_reduce_hook(AllReduceHook hook) { all_reduce_hook_ = std::move(hook); }
  void set_unshard_in_backward(bool unshard) { unshard_in_backward_ = unshard; }
  /// FSDP1's register_comm_hook: Note [Reduce hook]. Between steps.
  void set_reduce_hook(ReduceHook hook) { reduce_hook_ = std::move(hook); }
  /// FSDPModule::set_custom_all_gather / set_custom_reduce_scatter (Note [Custom
  /// collectives]): between steps; null restores FSDP's own.
  void set_custom_all_gather(std::shared_ptr<AllGather> comm);
  void set_custom_reduce_scatter(std::shared_ptr<ReduceScatter> comm);
  /// FSDPModule::set_reshard_after_backward (Note [Unsharded after backward]).
  void set_reshard_after_backward(bool reshard) { reshard_after_backward_ = reshard; }
  bool requires_gradient_sync() const { return requires_gradient_sync_; }
  /// Explicit prefetch targets (FSDP2's set_modules_to_*_prefetch); replace the recorded
  /// order for this group.
  void set_forward_prefetch(std::vector<ParamGroup*> groups) { forward_prefetch_ = groups; }
  void set_backward_prefetch(std::vector<ParamGroup*> groups) { backward_prefetch_ = groups; }

  // ---- verbs (idempotent; each checks its precondition) ----
  /// `by_user` (FSDPModule::unshard): the copy-in waits for the compute stream itself, since
  /// a user's call may follow writes to the shards made after the root's forward ordered
  /// the copy-ins (an optimizer step or a state-dict load after a forward with no backward),
  /// as FSDP2's explicit unshard copies in on the current stream.
  void unshard(bool async_op, bool by_user = false);
  void wait_for_unshard();
  void reshard();
  /// summon_full_params: all-gathers the full parameters in the sharded dtype (with_grads:
  /// their gradients too) / puts the shards back, copying writes into them (writeback).
  void summon(bool with_grads);
  void unsummon(bool writeback);
  /// Join shadow (Note [Join replay]): the same collective as a training rank's, with this
  /// rank's real shards for all-gathers and zero gradients for reduce-scatters.
  void replay_all_gather(bool from_post_forward_slab);
  void replay_reduce_scatter();

  // ---- phases, called by FSDPState's hooks ----
  void pre_forward();
  void post_forward();
  void pre_backward();
  /// From autograd, once per call of the module that built a graph; acts on the last one
  /// (Note [Module called more than once]).
  void post_backward();
  /// Installs the gradients of a finished reduce-scatter (called via CommContext); on an
  /// accelerator on the reduce-scatter stream (Note [FSDP streams]).
  void finish_reduce();
  /// After finish_reduce on an accelerator: the compute stream waits for the reduce-scatter
  /// stream, and the host for gradients still being copied to it (CPU offload). Called at the
  /// end of backward for every group, and before a backward adds to the gradients.
  void join_reduce_stream();
  /// The compute device's FSDP streams (null on the CPU).
  DeviceStreams* streams() const { return streams_; }
  /// End of backward: runs any post-backward that autograd did not trigger, reshards,
  /// returns to idle.
  void finalize_backward();

  size_t unsharded_bytes() const;

 private:
  void reshard_post_forward();
  /// The reduce-scatter of this step's gradients and the reshard, once every call's
  /// backward has run.
  void reduce_and_reshard();
  /// Points every parameter at its unsharded data / its shard (Note [Parameter identity]).
  void point_params(bool unsharded);
  void prefetch(const std::optional<std::vector<ParamGroup*>>& explicit_targets,
                ParamGroup* recorded_next, bool backward);
  c10::ScalarType reduce_dtype() const;
  /// Copies `grads` in and issues the reduce-scatter (reduce_pending_).
  void issue_reduce(const std::vector<at::Tensor>& grads);
  void hold_partial_reduce();
  /// Note [Backward without parameters].
  void point_without_data();
  void check(bool condition, const char* verb, const char* expected) const;
  /// Note [Custom collectives]: moves the group to PerCallBuffers, between steps only.
  void use_per_call_buffers(const char* verb);
  GroupBuffersContext buffers_context();

  GroupLabels labels_;
  std::vector<std::unique_ptr<ShardedParam>> params_;
  std::vector<ShardedParam*> raw_;
  // The layout, shared with placed all-gathers (Note [Abandoned placed all-gather]); flat_
  // reads it.
  std::shared_ptr<const FlatLayout> layout_;
  const FlatLayout& flat_;
  ProcessGroupPtr group_;
  GroupConfig config_;
  CommContext* comm_ = &CommContext::detached();  // never null
  bool requires_gradient_sync_ = true;
  std::optional<double> gradient_divide_factor_;
  bool requires_all_reduce_ = true;
  /// Note [Unsharded after backward]: keep the parameters unsharded after a backward that
  /// does not sync gradients; kept_after_backward_: this backward did, so the sharded
  /// gradients are still stashed (P.grad is unset while P holds its full data).
  bool reshard_after_backward_ = true;
  bool kept_after_backward_ = false;
  AllReduceHook all_reduce_hook_;
  ReduceHook reduce_hook_;    // read by buffers_ (its context refers to it)
  CustomComms custom_comms_;  // likewise
  bool unshard_in_backward_ = true;
  /// Note [Accumulation without all-reduce]: the sum of the reduce-scatter outputs of the
  /// backwards that skipped the replica all-reduce (undivided), or undefined.
  at::Tensor partial_reduce_;
  std::optional<std::vector<ParamGroup*>> forward_prefetch_;
  std::optional<std::vector<ParamGroup*>> backward_prefetch_;
  std::vector<at::Tensor> summoned_grads_;  // the sharded grads, kept while kSummoned
  bool is_root_ = false;

  ShardState shard_state_ = ShardState::kSharded;
  TrainingState training_state_ = TrainingState::kIdle;
  /// Note [Module called more than once]: forward calls that built a graph since the last
  /// backward, and post-backward hooks fired so far.
  int graph_forward_calls_ = 0;
  int post_backward_calls_ = 0;
  at::Tensor post_forward_slab_;      // valid while kShardedPostForward
  bool reduce_pending_ = false;       // a reduce-scatter was issued and not yet finished
  DeviceStreams* streams_ = nullptr;  // the compute device's; null on the CPU
  bool reduce_stream_ahead_ = false;  // finish_reduce queued work the compute stream has not joined
  FSDPStats stats_;
  std::vector<at::Tensor> grads_;  // post_backward's scratch (keeps its capacity)
  // Last: it refers to the members above, and its destructor may still wait on an
  // all-gather that writes into the parameters' storage (Note [Abandoned placed all-gather]).
  std::unique_ptr<GroupBuffers> buffers_;
};

}  // namespace tdist::fsdp::detail

#pragma once

// What the param groups of one FSDP tree share: the all-gather rate limit, the one pending
// reduce-scatter, and the forward order used for prefetching. Owned by the root state.

#include <deque>
#include <vector>

namespace tdist::fsdp::detail {

class DeviceStreams;
class ParamGroup;

/// One collective FSDP issued, as the Join shadow replays it (Note [Join replay]).
struct CommEvent {
  enum class Kind { kAllGather, kAllGatherPostForward, kReduceScatter };
  Kind kind;
  ParamGroup* group;
};

class CommContext {
 public:
  /// Note [Detached context]: the context of a group that no root has taken into its tree
  /// yet (explicit unshard before the first forward), and of the Join replay: it records
  /// nothing, limits and prefetches nothing, and finishes every reduce-scatter as soon as it
  /// is issued. Stateless, so one instance serves every group; a group's context is never
  /// null.
  static CommContext& detached();

  /// Note [All-gather rate limit]
  /// At most `all_gather_limit` all-gathers may be in flight (issued, not yet waited).
  /// Issuing one more first finishes the oldest. Each in-flight all-gather holds a full
  /// unsharded copy of its group, so this bounds memory to ~limit extra groups.
  int all_gather_limit = 2;
  bool prefetch = true;
  bool forward_prefetch = true;
  bool backward_prefetch = true;

  /// Note [FSDP streams]: the compute device's streams (null on the CPU), and whether the
  /// all-gather copy-in stream is ordered after the last optimizer step for the forward and
  /// backward in progress (the root's pre-forward made it wait once); until then every
  /// all-gather waits for the compute stream itself.
  DeviceStreams* streams = nullptr;
  bool all_gather_inputs_ordered = false;

  /// Called by a group before it issues its all-gather / after it waited for it.
  void before_all_gather(ParamGroup* group);
  void after_all_gather(ParamGroup* group);

  /// Note [One pending reduce-scatter]
  /// A reduce-scatter's input is a full-size gradient buffer; keeping them all until the end
  /// of backward would hold the whole unsharded gradient. So a group's reduce-scatter is
  /// finished when the next group issues its own (or at the end of backward).
  void set_pending_reduce(ParamGroup* group);
  void finish_pending_reduce();

  /// Orders recorded during the first forward (Note [Prefetch order]).
  void record_forward(ParamGroup* group);
  void record_post_forward(ParamGroup* group);
  void freeze_order() { order_frozen_ = !forward_order_.empty(); }
  bool order_frozen() const { return order_frozen_; }
  /// The group to prefetch after `group`'s forward / backward unshard (nullptr if none).
  ParamGroup* next_forward(const ParamGroup* group) const;
  ParamGroup* next_backward(const ParamGroup* group) const;

  /// Note [Join replay]: the collectives of the step in progress, in issue order; at the
  /// end of backward they become last_step(), which a joined rank replays.
  void begin_step() { current_step_.clear(); }
  void record(CommEvent event) {
    if (!detached_) current_step_.push_back(event);
  }
  void end_step() {
    last_step_.swap(current_step_);  // both keep their capacity: no allocation per step
    current_step_.clear();
  }
  const std::vector<CommEvent>& last_step() const { return last_step_; }

 private:
  bool detached_ = false;
  std::vector<CommEvent> current_step_;
  std::vector<CommEvent> last_step_;
  std::deque<ParamGroup*> in_flight_;
  ParamGroup* pending_reduce_ = nullptr;
  std::vector<ParamGroup*> forward_order_;
  std::vector<ParamGroup*> post_forward_order_;
  bool order_frozen_ = false;
};

}  // namespace tdist::fsdp::detail

// The FSDP lifecycle, in one place.
//
//  Shard state of a group (ShardState)
//
//      kSharded ───unshard()──▶ kUnsharding ───wait_for_unshard()──▶ kUnsharded
//         ▲                        ▲                                    │  │
//         │                        │ unshard() (all-gather within the   │  │ post_forward,
//         │                        │ k-rank group only)                 │  │ integer reshard
//         │                  kShardedPostForward ◀──────────────────────┘  │
//         └──────────── reshard() (from any state) ◀───────────────────────┘
//
//      kSharded ───summon()──▶ kSummoned ───unsummon(writeback)──▶ kSharded
//      (summon_full_params: full data in the sharded dtype, outside forward/backward)
//
//      kSharded ───pre_backward, unshard_in_backward false──▶ kUnshardedNoData
//      (full shapes, no storage: Note [Backward without parameters]) ───reshard()──▶ kSharded
//
//  Training state of a group (TrainingState), once per step:
//
//      kIdle ─pre_forward─▶ kForward ─post_forward─▶ kIdle ─pre_backward─▶ kPreBackward
//        ▲                                                                    │
//        └──── finalize_backward (root's end-of-backward callback) ◀─ kPostBackward
//                                                             post_backward ─┘
//
//  pre_forward   : unshard (async), prefetch the next group, wait.
//  post_forward  : reshard as reshard_after_forward says (the root keeps its parameters).
//  pre_backward  : stash sharded grads, unshard (async), prefetch the previous group, wait.
//  post_backward : take the unsharded grads, reduce-scatter them (async), reshard. With
//                  gradient sync off, keep them unsharded instead (accumulated with the
//                  next synced backward's), and with reshard_after_backward false keep the
//                  parameters unsharded too (the next forward gathers nothing). With HSDP,
//                  finishing the reduce-scatter all-reduces the shard gradient across
//                  replicas.
//  finalize      : post_backward for groups autograd did not reach, wait for the last
//                  reduce-scatter, reshard everything, back to kIdle.
//
// Every verb is idempotent: calling it in the state it leads to does nothing. A verb called
// in a state it cannot leave raises (a bug in FSDP or a misuse, never silently ignored).

#include "fsdp/param_group.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdp/comm_context.h"
#include "fsdp/device_streams.h"
#include "fsdp/hook_timing.h"
#include "fsdp/per_call_buffers.h"
#include "fsdp/trace_scope.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/flight_recorder.h"
#include "tdist/detail/util/torch_compat.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {

namespace {

std::vector<ShardedParam*> raw_pointers(const std::vector<std::unique_ptr<ShardedParam>>& params) {
  std::vector<ShardedParam*> raw;
  for (const auto& p : params) raw.push_back(p.get());
  return raw;
}

void wait_work(const WorkPtr& work, const ProcessGroupPtr& group, FSDPStats& stats) {
  CommTimer timer(stats.wait_ns);
  std::chrono::milliseconds timeout = group->timeout();
  if (timeout.count() <= 0) timeout = kDefaultPgTimeout;
  work->wait(timeout);
}

}  // namespace

const char* to_string(ShardState state) {
  switch (state) {
    case ShardState::kSharded:
      return "sharded";
    case ShardState::kShardedPostForward:
      return "sharded_post_forward";
    case ShardState::kUnsharding:
      return "unsharding";
    case ShardState::kUnsharded:
      return "unsharded";
    case ShardState::kUnshardedNoData:
      return "unsharded_no_data";
    case ShardState::kSummoned:
      return "summoned";
  }
  return "?";
}

const char* to_string(TrainingState state) {
  switch (state) {
    case TrainingState::kIdle:
      return "idle";
    case TrainingState::kForward:
      return "forward";
    case TrainingState::kPreBackward:
      return "pre_backward";
    case TrainingState::kPostBackward:
      return "post_backward";
  }
  return "?";
}

ParamGroup::ParamGroup(std::string label, std::vector<std::unique_ptr<ShardedParam>> params,
                       ProcessGroupPtr group, GroupConfig config)
    : params_(std::move(params)),
      raw_(raw_pointers(params_)),
      layout_(std::make_shared<const FlatLayout>(FlatLayout::of(raw_))),
      flat_(*layout_),
      group_(std::move(group)),
      config_(std::move(config)) {
  set_label(std::move(label));
  streams_ = device_streams_for(raw_.front()->unsharded_options().device());
  buffers_ = make_group_buffers(buffers_context(), config_);
}

GroupBuffersContext ParamGroup::buffers_context() {
  return {raw_, layout_, group_, labels_, stats_, streams_, reduce_hook_, custom_comms_};
}

void ParamGroup::set_custom_all_gather(std::shared_ptr<AllGather> comm) {
  use_per_call_buffers("set_custom_all_gather");
  custom_comms_.all_gather = std::move(comm);
}

void ParamGroup::set_custom_reduce_scatter(std::shared_ptr<ReduceScatter> comm) {
  use_per_call_buffers("set_custom_reduce_scatter");
  custom_comms_.reduce_scatter = std::move(comm);
}

void ParamGroup::use_per_call_buffers(const char* verb) {
  // Persistent buffers are FSDP's own memory and collectives. The shards they hold stay
  // alive as the parameters' views, which PerCallBuffers reads; the unsharded tensors, one
  // shared storage there, get one each again (PerCallBuffers sizes them one by one).
  check(shard_state_ == ShardState::kSharded && training_state_ == TrainingState::kIdle &&
            !reduce_pending_,
        verb, "sharded and idle, between steps (before the forward or after the backward)");
  if (dynamic_cast<PerCallBuffers*>(buffers_.get()) != nullptr) return;
  buffers_.reset();
  for (ShardedParam* p : raw_) p->own_unsharded_storage();
  buffers_ = std::make_unique<PerCallBuffers>(buffers_context());
}

ParamGroup::~ParamGroup() = default;

void ParamGroup::set_label(std::string label) {
  labels_.module = std::move(label);
  labels_.all_gather = labels_.module + " all_gather";
  labels_.reduce_scatter = labels_.module + " reduce_scatter";
}

void ParamGroup::check(bool condition, const char* verb, const char* expected) const {
  if (condition) return;
  TDIST_THROW(Error, std::string("FSDP: ") + verb + " of module '" + label() + "' on rank " +
                         std::to_string(group_->rank()) + " in shard state " +
                         to_string(shard_state_) + ", training state " +
                         to_string(training_state_) + "; expected " + expected +
                         ". Call sharded modules only through tdist::fsdp::forward and run "
                         "backward before the next forward of the same module");
}

// ---- verbs ------------------------------------------------------------------------------

void ParamGroup::unshard(bool async_op, bool by_user) {
  if (shard_state_ == ShardState::kUnsharding || shard_state_ == ShardState::kUnsharded) {
    if (!async_op) wait_for_unshard();
    return;
  }
  check(shard_state_ != ShardState::kSummoned, "unshard", "the end of summon_full_params first");
  if (shard_state_ == ShardState::kUnshardedNoData) reshard();
  comm_->before_all_gather(this);
  comm_->record({shard_state_ == ShardState::kShardedPostForward
                     ? CommEvent::Kind::kAllGatherPostForward
                     : CommEvent::Kind::kAllGather,
                 this});
  const bool from_slab = shard_state_ == ShardState::kShardedPostForward;
  buffers_->start_all_gather(from_slab ? post_forward_slab_.view({-1}) : at::Tensor(),
                             config_.post_forward_group,
                             /*inputs_ordered=*/!by_user && comm_->all_gather_inputs_ordered);
  shard_state_ = ShardState::kUnsharding;
  ++stats_.all_gathers;
  if (!async_op) wait_for_unshard();
}

void ParamGroup::wait_for_unshard() {
  if (shard_state_ == ShardState::kUnsharded) return;
  check(shard_state_ == ShardState::kUnsharding, "wait_for_unshard", "an unshard() first");
  wait_work(buffers_->all_gather_work(), group_, stats_);
  buffers_->finish_all_gather();
  post_forward_slab_ = at::Tensor();
  point_params(/*unsharded=*/true);
  shard_state_ = ShardState::kUnsharded;
  comm_->after_all_gather(this);
}

void ParamGroup::reshard() {
  if (shard_state_ == ShardState::kSharded) return;
  check(shard_state_ != ShardState::kSummoned, "reshard", "the end of summon_full_params");
  // Never free a buffer an all-gather may still be writing.
  if (shard_state_ == ShardState::kUnsharding) wait_for_unshard();
  TraceScope trace("FSDP::reshard", label());
  point_params(/*unsharded=*/false);
  if (shard_state_ == ShardState::kUnshardedNoData) {  // nothing was allocated
    shard_state_ = ShardState::kSharded;
    return;
  }
  if (kept_after_backward_) {  // Note [Unsharded after backward]: the stash returns
    kept_after_backward_ = false;
    for (ShardedParam* p : raw_) p->accumulate_sharded_grad(at::Tensor());
  }
  {
    CopyTimer copy(stats_);
    buffers_->free_unsharded();  // Note [Freeing unsharded storage]
    post_forward_slab_ = at::Tensor();
  }
  shard_state_ = ShardState::kSharded;
}

// Note [Prefetching before re-pointing]
// Re-pointing a parameter writes a few fields of its TensorImpl and touches the TensorImpl it
// takes them from: ~0.3 us per parameter with warm caches, but ~1.4 us right after the
// module's compute has evicted them (bench/HISTORY.md), and one parameter's cache
// misses do not overlap the next one's (the storage refcount updates are atomic). Prefetching
// every TensorImpl of the group first lets those misses overlap.
void ParamGroup::point_params(bool unsharded) {
  for (ShardedParam* p : raw_) p->prefetch_pointing(unsharded);
  if (unsharded) {
    for (ShardedParam* p : raw_) p->use_unsharded();
  } else {
    for (ShardedParam* p : raw_) p->use_sharded();
  }
}

void ParamGroup::set_reshard_after_forward(bool reshard) {
  check(training_state_ == TrainingState::kIdle && shard_state_ != ShardState::kShardedPostForward,
        "set_reshard_after_forward", "between steps (not inside forward or backward)");
  config_.reshard_after_forward = ReshardAfterForward(reshard);
}

void ParamGroup::set_gradient_divide_factor(std::optional<double> factor) {
  TDIST_CHECK_ARG(!factor || *factor > 0,
                  "set_gradient_divide_factor: the factor must be "
                  "positive, got " +
                      std::to_string(factor.value_or(0)));
  gradient_divide_factor_ = factor;
}

// Note [Reshard to a smaller group]
// reshard_after_forward = k keeps, after forward, the slab of the [world, total] all-gather
// buffer made of rank blocks [j * world/k, (j+1) * world/k), where j is this rank's index in
// its k-rank group (ranks b*k .. b*k+k-1). The k slabs of one group tile the whole buffer in
// order, so backward's all-gather runs within the small group (e.g. within a node).
void ParamGroup::reshard_post_forward() {
  const int k = config_.reshard_after_forward.group_size();
  const int world = group_->size();
  if (k == 1) return;  // reshard_after_forward=false: keep the parameters for backward
  if (k == 0 || k >= world || !config_.post_forward_group) {
    reshard();
    return;
  }
  check(shard_state_ == ShardState::kUnsharded, "reshard_post_forward", "unsharded");
  const int per = world / k;
  const int j = config_.post_forward_group->rank();
  CopyTimer copy(stats_);
  at::Tensor slab = at::empty({per, flat_.total}, raw_.front()->unsharded_options());
  for (size_t i = 0; i < raw_.size(); ++i) {
    slab.narrow(1, flat_.offsets[i], flat_.numels[i])
        .copy_(raw_[i]->padded_unsharded().view({world, flat_.numels[i]}).narrow(0, j * per, per));
  }
  reshard();
  post_forward_slab_ = std::move(slab);
  shard_state_ = ShardState::kShardedPostForward;
}

// Note [Summoned parameters]
// summon_full_params hands the user the full parameters in their own (master) dtype, not
// param_dtype: they gather the fp32 shards into separate tensors, so no mixed-precision
// rounding leaks into writes made through them.
void ParamGroup::summon(bool with_grads) {
  check(shard_state_ == ShardState::kSharded && training_state_ == TrainingState::kIdle,
        "summon_full_params", "sharded and idle (not inside forward or backward)");
  TraceScope trace("FSDP::summon_full_params", label());
  summoned_grads_.assign(raw_.size(), at::Tensor());
  for (size_t i = 0; i < raw_.size(); ++i) {
    ShardedParam& p = *raw_[i];
    at::NoGradGuard no_grad;
    at::Tensor full = all_gather_whole(p.local_shard(), p, group_);
    if (with_grads) {
      at::Tensor grad = p.param().grad();
      at::Tensor full_grad =
          all_gather_whole(grad.defined() ? grad : at::zeros_like(p.local_shard()), p, group_);
      summoned_grads_[i] = grad;
      p.param().mutable_grad() = grad.defined() ? full_grad : at::Tensor();
    }
    p.use_full(full);
  }
  shard_state_ = ShardState::kSummoned;
}

void ParamGroup::unsummon(bool writeback) {
  if (shard_state_ != ShardState::kSummoned) return;
  for (size_t i = 0; i < raw_.size(); ++i) {
    ShardedParam& p = *raw_[i];
    if (writeback) {
      at::NoGradGuard no_grad;
      const ShardLayout& pl = p.layout();
      if (pl.local_rows > 0) {
        p.local_shard().copy_(p.param().narrow(pl.shard_dim, pl.row_offset, pl.local_rows));
      }
    }
    p.use_sharded();
    if (!summoned_grads_.empty()) p.param().mutable_grad() = summoned_grads_[i];
  }
  summoned_grads_.clear();
  shard_state_ = ShardState::kSharded;
}

// Note [Join replay]
// A joined rank has no inputs, so it cannot run forward and backward; it replays the
// collectives FSDP issued in the last training step, synchronously and in the same order
// (each process group matches collectives by issue order). The post-forward transition
// follows each all-gather so that a backward all-gather from a k-rank slab finds its slab.
void ParamGroup::replay_all_gather(bool from_post_forward_slab) {
  CommContext* comm = comm_;
  comm_ = &CommContext::detached();  // not recorded, not rate-limited: each is waited
  if (from_post_forward_slab) {
    check(shard_state_ == ShardState::kShardedPostForward, "Join replay of an all-gather",
          "a post-forward slab (replayed steps must match the training ranks' steps)");
    unshard(/*async_op=*/false);
    reshard();
  } else {
    reshard();
    unshard(/*async_op=*/false);
    reshard_post_forward();
  }
  comm_ = comm;
}

void ParamGroup::replay_reduce_scatter() {
  for (ShardedParam* p : raw_) p->stash_sharded_grad();
  const std::vector<at::Tensor> zeros(raw_.size());  // undefined: reduced as zeros
  issue_reduce(zeros);
  ++stats_.reduce_scatters;
  finish_reduce();
  join_reduce_stream();
}

// ---- phases -----------------------------------------------------------------------------

// Prefetching: an explicit list (set_modules_to_*_prefetch) replaces the recorded order.
void ParamGroup::prefetch(const std::optional<std::vector<ParamGroup*>>& explicit_targets,
                          ParamGroup* recorded_next, bool backward) {
  auto fetch = [this, backward](ParamGroup* next) {
    if (next == nullptr || next == this) return;
    if (backward && !next->unshard_in_backward_) return;  // Note [Backward without parameters]
    if (next->shard_state_ == ShardState::kUnsharding ||
        next->shard_state_ == ShardState::kUnsharded) {
      return;
    }
    next->unshard(/*async_op=*/true);
    ++next->stats_.prefetches;
  };
  if (explicit_targets) {
    for (ParamGroup* next : *explicit_targets) fetch(next);
  } else {
    fetch(recorded_next);
  }
}

c10::ScalarType ParamGroup::reduce_dtype() const {
  return config_.reduce_dtype.value_or(
      c10::typeMetaToScalarType(raw_.front()->unsharded_options().dtype()));
}

void ParamGroup::pre_forward() {
  TraceScope trace("FSDP::pre_forward", label());
  training_state_ = TrainingState::kForward;
  if (torch::autograd::GradMode::is_enabled()) ++graph_forward_calls_;
  comm_->record_forward(this);
  unshard(/*async_op=*/true);
  if (comm_->prefetch && comm_->forward_prefetch) {
    prefetch(forward_prefetch_, comm_->next_forward(this), /*backward=*/false);
  }
  wait_for_unshard();
}

void ParamGroup::post_forward() {
  TraceScope trace("FSDP::post_forward", label());
  comm_->record_post_forward(this);
  if (!torch::autograd::GradMode::is_enabled()) {
    reshard();  // no backward will follow (inference): always free
  } else if (!is_root_) {
    reshard_post_forward();
  }
  training_state_ = TrainingState::kIdle;
}

void ParamGroup::pre_backward() {
  if (training_state_ == TrainingState::kPreBackward) return;  // one hook per output node
  TraceScope trace("FSDP::pre_backward", label());
  // The previous backward was not the last (set_is_last_backward(false)) and left this
  // group's reduce-scatter in flight: land it before stashing the gradients it updates.
  if (reduce_pending_) comm_->finish_pending_reduce();
  if (reduce_pending_) finish_reduce();
  join_reduce_stream();
  training_state_ = TrainingState::kPreBackward;
  kept_after_backward_ = false;  // a stash kept unsharded is this backward's to return
  {
    CopyTimer copy(stats_);  // accumulates onto an earlier stash (gradient accumulation)
    for (ShardedParam* p : raw_) p->stash_sharded_grad();
  }
  const bool without_data = !unshard_in_backward_ && shard_state_ != ShardState::kUnsharded;
  if (without_data) {
    point_without_data();
  } else {
    unshard(/*async_op=*/true);
  }
  if (comm_->prefetch && comm_->backward_prefetch) {
    prefetch(backward_prefetch_, comm_->next_backward(this), /*backward=*/true);
  }
  if (!without_data) wait_for_unshard();
}

// Note [Backward without parameters]
// FSDP2's set_unshard_in_backward(false): the backward of this group's module reads none of
// its parameters (an embedding: its weight gradient is a scatter of the output gradient by
// the ids), so backward all-gathers nothing. Autograd still accumulates each parameter's
// gradient into the parameter, checking its shape, so the parameters are pointed at their
// unsharded views whose storage stays freed: full shapes, no data. The gradients are taken
// and reduced as usual and reshard() points the parameters back at their shards.
void ParamGroup::point_without_data() {
  if (shard_state_ == ShardState::kUnshardedNoData) return;
  reshard();  // from a post-forward slab or an earlier state: back to the shards first
  point_params(/*unsharded=*/true);
  shard_state_ = ShardState::kUnshardedNoData;
}

// Note [Module called more than once]
// A module applied several times in one forward (a block reused, weights shared through
// repeated calls) gets one pre-forward / post-forward per call: each call all-gathers (after
// the previous call's reshard) and reshards as usual. Its parameters are leaves used several
// times, so autograd sums their gradients from every call into one accumulation; the group
// must keep them unsharded until every call's backward has run, and reduce once. Each call
// registers a post-backward hook on its inputs; the hook acts on the last of them (the
// forward's first call), and the end-of-backward callback acts for calls whose inputs needed
// no gradient (their hooks never fire). The first pre-backward unshards; the later ones find
// the group unsharded. The counts restart at the end of each backward: a forward that built
// a graph nobody ran backward through only delays the next reduce to that callback.
void ParamGroup::post_backward() {
  if (training_state_ != TrainingState::kPreBackward) return;  // already ran this step
  if (++post_backward_calls_ < graph_forward_calls_) return;   // an earlier call's backward follows
  reduce_and_reshard();
}

void ParamGroup::reduce_and_reshard() {
  TraceScope trace("FSDP::post_backward", label());
  training_state_ = TrainingState::kPostBackward;
  check(shard_state_ == ShardState::kUnsharded || shard_state_ == ShardState::kUnshardedNoData,
        "post_backward", "unsharded");
  std::vector<at::Tensor>& grads = grads_;
  grads.clear();
  bool any_trainable = false;
  for (ShardedParam* p : raw_) {
    at::Tensor grad = p->take_unsharded_grad();
    if (!p->requires_grad()) grad = at::Tensor();  // frozen: never reduced
    any_trainable = any_trainable || p->requires_grad();
    grads.push_back(std::move(grad));
  }
  if (!requires_gradient_sync_ || !any_trainable) {
    struct Clear {  // the scratch never keeps gradients alive past this call
      std::vector<at::Tensor>& grads;
      ~Clear() { grads.clear(); }
    } clear{grads};
    // Note [Accumulation without sync]: the unsharded gradients stay on this rank (in the
    // reduce dtype) until a synced backward reduces their sum; the sharded grads return.
    CopyTimer copy(stats_);
    for (size_t i = 0; i < raw_.size(); ++i) {
      if (grads[i].defined()) raw_[i]->accumulate_unsharded_grad(grads[i].to(reduce_dtype()));
    }
    if (!reshard_after_backward_) {
      kept_after_backward_ = true;  // Note [Unsharded after backward]
      return;
    }
    for (ShardedParam* p : raw_) p->accumulate_sharded_grad(at::Tensor());
    reshard();
    return;
  }
  for (size_t i = 0; i < raw_.size(); ++i) {
    at::Tensor kept = raw_[i]->take_accumulated_unsharded_grad();
    if (!kept.defined()) continue;
    CopyTimer copy(stats_);
    grads[i] = grads[i].defined() ? kept.add_(grads[i]) : kept;
  }
  // Every rank whose pre-backward ran reduces (missing grads count as zeros), so ranks
  // always issue the same collectives.
  comm_->finish_pending_reduce();
  comm_->record({CommEvent::Kind::kReduceScatter, this});
  issue_reduce(grads);
  {
    CopyTimer copy(stats_);
    grads.clear();  // the unsharded gradients are in the reduce-scatter input now
  }
  ++stats_.reduce_scatters;
  reshard();
  comm_->set_pending_reduce(this);
}

// Note [Gradient averaging]
// Each rank's loss is the mean over its local batch; the reduce-scatter sums, and dividing
// by the group size gives the gradient of the mean over the global batch, as PyTorch's FSDP
// and DDP do. With HSDP the shard sums are all-reduced across replicas first (in the reduce
// dtype too: pytorch#190626), and the divisor is shard size x replicas.
void ParamGroup::finish_reduce() {
  if (!reduce_pending_) return;
  // Note [FSDP streams]: waited for, reduced and installed on the reduce-scatter stream.
  StreamScope on_reduce_scatter(streams_, StreamRole::kReduceScatter);
  reduce_stream_ahead_ = streams_ != nullptr;
  wait_work(buffers_->reduce_scatter_work(), group_, stats_);
  at::Tensor& reduced = buffers_->reduce_output();
  double divisor = group_->size();
  const ProcessGroupPtr& replicas = config_.replicate_group;
  if (reduce_hook_) {
    divisor = 1.0;  // Note [Reduce hook]: reduced across replicas too, and averaged
  } else if (replicas && replicas->size() > 1) {
    if (!requires_all_reduce_) {
      hold_partial_reduce();
      return;
    }
    if (partial_reduce_.defined()) {
      CopyTimer copy(stats_);
      reduced.add_(partial_reduce_);
      partial_reduce_ = at::Tensor();
    }
    TraceScope trace("FSDP::all_reduce_replicas", label());
    ++stats_.all_reduces;
    WorkPtr work;
    {
      CommTimer issue(stats_.comm_issue_ns);
      CollectiveLabelScope label_scope(label() + " all_reduce_replicas");
      work = all_reduce(reduced, ReduceOp::SUM, replicas, /*async_op=*/true);
    }
    wait_work(work, replicas, stats_);
    divisor *= replicas->size();
  }
  if (!reduce_hook_) divisor = gradient_divide_factor_.value_or(divisor);
  if (all_reduce_hook_) {
    {
      CopyTimer copy(stats_);
      reduced.div_(divisor);
    }
    TraceScope trace("FSDP::all_reduce_hook", label());
    all_reduce_hook_(reduced);
    divisor = 1.0;
  }
  buffers_->install_reduced_grads(divisor);
  reduce_pending_ = false;
}

// Note [Accumulation without all-reduce]
// With set_requires_all_reduce(false), a backward's reduce-scatter output (this rank's shard
// summed over the shard group) is added to partial_reduce_ instead of being all-reduced
// across replicas, divided and installed; the stashed gradients go back unchanged. The next
// backward that all-reduces adds partial_reduce_ first, so one all-reduce carries the sum of
// every skipped backward: the same gradient as all-reducing each, with one collective.
void ParamGroup::hold_partial_reduce() {
  CopyTimer copy(stats_);
  const at::Tensor& reduced = buffers_->reduce_output();
  if (partial_reduce_.defined()) {
    partial_reduce_.add_(reduced);
  } else {
    partial_reduce_ = reduced.clone();  // the output may be a pooled or persistent buffer
  }
  for (ShardedParam* p : raw_) p->accumulate_sharded_grad(at::Tensor());
  buffers_->drop_reduced();
  reduce_pending_ = false;
}

void ParamGroup::join_reduce_stream() {
  if (!reduce_stream_ahead_) return;
  reduce_stream_ahead_ = false;
  streams_->wait(StreamRole::kCompute, StreamRole::kReduceScatter);
  streams_->host_wait();
}

void ParamGroup::issue_reduce(const std::vector<at::Tensor>& grads) {
  buffers_->start_reduce_scatter(grads, reduce_dtype());
  reduce_pending_ = true;
}

// Note [Unsharded after backward]
// FSDP2's set_reshard_after_backward(false) saves the next forward's all-gather during
// gradient accumulation. Here a parameter is one variable that holds either its shard or its
// full data (Note [Parameter identity]), so it can stay unsharded only after a backward that
// leaves no sharded gradient to install: one with gradient sync off. Its stashed sharded
// gradient stays aside meanwhile (P.grad is unset, so an optimizer step in between changes
// nothing), and returns at the next backward or reshard. A backward that reduces always
// reshards, since its gradient belongs to the shard the optimizer steps; FSDP2 would keep
// the full parameters then, and the step would leave them stale.
void ParamGroup::finalize_backward() {
  if (training_state_ == TrainingState::kPreBackward) reduce_and_reshard();
  graph_forward_calls_ = 0;
  post_backward_calls_ = 0;
  if (!kept_after_backward_) reshard();
  training_state_ = TrainingState::kIdle;
}

size_t ParamGroup::unsharded_bytes() const {
  return buffers_->unsharded_bytes();
}

}  // namespace tdist::fsdp::detail

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
#include "fsdp/hook_timing.h"
#include "fsdp/trace_scope.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/flight_recorder.h"
#include "tdist/error.h"
#include "tdist/util/torch_compat.h"

namespace tdist::fsdp::detail {

namespace {

std::vector<ShardedParam*> raw_pointers(const std::vector<std::unique_ptr<ShardedParam>>& params) {
  std::vector<ShardedParam*> raw;
  for (const auto& p : params) raw.push_back(p.get());
  return raw;
}

// A plain contiguous tensor of `sizes` over `base`'s storage, `offset` elements in
// (util::alias_storage: optimizers may detach_() it).
at::Tensor raw_alias(const at::Tensor& base, int64_t offset, const std::vector<int64_t>& sizes) {
  return util::contiguous_alias(base, sizes, base.storage_offset() + offset);
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
    : label_(std::move(label)),
      params_(std::move(params)),
      raw_(raw_pointers(params_)),
      layout_(std::make_shared<const FlatLayout>(FlatLayout::of(raw_))),
      flat_(*layout_),
      group_(std::move(group)),
      config_(std::move(config)) {
  set_label(label_);
  init_persistent_buffers();
}

// Note [Abandoned placed all-gather]
// The unsharded block is held while an all-gather is pending only when that all-gather is
// placed (training abandoned mid-step, e.g. an exception out of a module's forward while the
// next module's all-gather was prefetched): it writes into the block from the collective's
// thread, so give it a moment, and if it has not finished, leak the block rather than free
// memory that thread may still write. The placer shares the layout it reads, so nothing else
// of this group is touched after it is gone.
ParamGroup::~ParamGroup() {
  if (unsharded_block_ && all_gather_.work) {
    try {
      all_gather_.work->wait(std::chrono::seconds(5));
    } catch (...) {
      // Failed collectives write nothing more; a timeout is checked below.
    }
    if (!all_gather_.work->is_completed()) {
      std::cerr << "tdist FSDP warning: module '" << label_
                << "' was destroyed while its all-gather was still in flight (a step abandoned "
                   "midway, with a peer not yet there); leaking its "
                << unsharded_block_.capacity
                << "-byte unsharded block, which that collective may still write\n";
      new PooledBlock(std::move(unsharded_block_));
    }
  }
  // Views autograd saved may outlive the group: they must see 0 bytes, not freed memory.
  if (unsharded_block_) util::free_storage(unsharded_flat_);
}

void ParamGroup::set_label(std::string label) {
  label_ = std::move(label);
  all_gather_label_ = label_ + " all_gather";
  reduce_label_ = label_ + " reduce_scatter";
}

// Note [Persistent buffers] (collectives.h): fully_shard decides which groups take this path
// (plain CPU groups computed and reduced in the parameters' own dtype, unless
// TDIST_FSDP_PERSISTENT_BUFFERS=0) and builds their flat shard in place; a group without one
// takes the general path.
void ParamGroup::init_persistent_buffers() {
  if (!config_.flat_shard.defined()) return;
  if (config_.flat_shard.numel() != flat_.total) {
    TDIST_THROW(Error, "FSDP internal: module '" + label_ + "': flat shard of " +
                           std::to_string(config_.flat_shard.numel()) + " elements for " +
                           std::to_string(flat_.total) + " padded shard elements");
  }
  const at::TensorOptions& options = raw_.front()->shard_options();
  const int world = raw_.front()->layout().world;
  element_size_ = options.dtype().itemsize();
  flat_shard_ = config_.flat_shard;
  config_.flat_shard = at::Tensor();
  // Note [One unsharded storage per group]: every param's unsharded tensor is an alias of one
  // StorageImpl, so unshard and reshard each touch one storage, not one per param (cold in
  // cache right after the module's compute).
  unsharded_flat_ = util::unallocated({world * flat_.total}, raw_.front()->unsharded_options());
  for (size_t i = 0; i < raw_.size(); ++i) {
    raw_[i]->share_unsharded_storage(unsharded_flat_, world * flat_.offsets[i]);
  }
  // Note [Pooled blocks in symmetric memory] (buffer_pool.cpp).
  const bool symmetric = config_.symmetric_buffers;
  all_gather_out_.init(world * flat_.total, options, symmetric);
  reduce_in_.init(world * flat_.total, options, symmetric);
  reduce_tmp_.init(flat_.total, options, symmetric);
  for (size_t i = 0; i < raw_.size(); ++i) {
    tmp_slices_.push_back(
        raw_alias(reduce_tmp_.tensor(), flat_.offsets[i], raw_[i]->layout().local_shape()));
  }
  // Note [Placed all-gather]: where the backend can, the all-gather writes every rank's
  // block straight into the unsharded block (no rank-major buffer, no copy-out).
  placed_all_gather_ = placed_all_gather_enabled() && can_all_gather_placed(flat_shard_, group_);
  fast_ = true;
}

void ParamGroup::init_grad_buffer() {
  grad_flat_ = at::zeros({flat_.total}, raw_.front()->shard_options());
  for (size_t i = 0; i < raw_.size(); ++i) {
    raw_[i]->set_grad_alias(
        raw_alias(grad_flat_, flat_.offsets[i], raw_[i]->layout().local_shape()));
  }
}

void ParamGroup::check(bool condition, const char* verb, const char* expected) const {
  if (condition) return;
  TDIST_THROW(Error, std::string("FSDP: ") + verb + " of module '" + label_ + "' on rank " +
                         std::to_string(group_->rank()) + " in shard state " +
                         to_string(shard_state_) + ", training state " +
                         to_string(training_state_) + "; expected " + expected +
                         ". Call sharded modules only through tdist::fsdp::forward and run "
                         "backward before the next forward of the same module");
}

// ---- verbs ------------------------------------------------------------------------------

void ParamGroup::unshard(bool async_op) {
  if (shard_state_ == ShardState::kUnsharding || shard_state_ == ShardState::kUnsharded) {
    if (!async_op) wait_for_unshard();
    return;
  }
  check(shard_state_ != ShardState::kSummoned, "unshard", "the end of summon_full_params first");
  if (comm_ != nullptr) {
    comm_->before_all_gather(this);
    comm_->record({shard_state_ == ShardState::kShardedPostForward
                       ? CommEvent::Kind::kAllGatherPostForward
                       : CommEvent::Kind::kAllGather,
                   this});
  }
  if (fast_) {
    TraceScope trace("FSDP::all_gather", label_);
    const bool slab = shard_state_ == ShardState::kShardedPostForward;
    all_gather_.input = slab ? post_forward_slab_.view({-1}) : flat_shard_;
    if (!slab && placed_all_gather_) {
      {
        CopyTimer copy(stats_);
        unsharded_block_ = buffer_pool().acquire(unsharded_block_bytes(), flat_shard_.device(),
                                                 config_.symmetric_buffers);
      }
      all_gather_.work =
          issue_all_gather_placed(static_cast<char*>(unsharded_block_.data.get()),
                                  all_gather_.input, layout_, group_, all_gather_label_, stats_);
    } else {
      {
        CopyTimer copy(stats_);
        all_gather_out_.acquire();
      }
      all_gather_.work =
          issue_all_gather(all_gather_out_.tensor(), all_gather_.input,
                           slab ? config_.post_forward_group : group_, all_gather_label_, stats_);
    }
  } else if (shard_state_ == ShardState::kShardedPostForward) {
    // Note [Reshard to a smaller group]: the slab holds world/k rank blocks; gathering the
    // k slabs of the small group rebuilds the whole [world, total] buffer.
    all_gather_ = foreach_all_gather(raw_, flat_, config_.post_forward_group, label_, stats_,
                                     post_forward_slab_.view({-1}));
  } else {
    all_gather_ = foreach_all_gather(raw_, flat_, group_, label_, stats_);
  }
  shard_state_ = ShardState::kUnsharding;
  ++stats_.all_gathers;
  if (!async_op) wait_for_unshard();
}

void ParamGroup::wait_for_unshard() {
  if (shard_state_ == ShardState::kUnsharded) return;
  check(shard_state_ == ShardState::kUnsharding, "wait_for_unshard", "an unshard() first");
  wait_work(all_gather_.work, group_, stats_);
  if (fast_) {
    TraceScope trace("FSDP::all_gather_copy_out", label_);
    CopyTimer copy(stats_);
    const size_t nbytes = unsharded_block_bytes();
    if (all_gather_out_.held()) {  // gathered rank-major: copy out (else placed already)
      unsharded_block_ =
          buffer_pool().acquire(nbytes, flat_shard_.device(), config_.symmetric_buffers);
      copy_out_flat(all_gather_out_.data(), static_cast<char*>(unsharded_block_.data.get()), flat_,
                    raw_.front()->layout().world, element_size_);
      all_gather_out_.release();
    }
    util::borrow_storage(unsharded_flat_, static_cast<char*>(unsharded_block_.data.get()), nbytes);
    all_gather_.work.reset();
    all_gather_.input = at::Tensor();
    post_forward_slab_ = at::Tensor();
  } else {
    TraceScope trace("FSDP::all_gather_copy_out", label_);
    CopyTimer copy(stats_);
    for (ShardedParam* p : raw_) p->alloc_unsharded();
    foreach_all_gather_copy_out(all_gather_, raw_, flat_);
    all_gather_ = AllGatherResult();  // frees the collective's buffers
    post_forward_slab_ = at::Tensor();
  }
  point_params(/*unsharded=*/true);
  shard_state_ = ShardState::kUnsharded;
  if (comm_ != nullptr) comm_->after_all_gather(this);
}

void ParamGroup::reshard() {
  if (shard_state_ == ShardState::kSharded) return;
  check(shard_state_ != ShardState::kSummoned, "reshard", "the end of summon_full_params");
  // Never free a buffer an all-gather may still be writing.
  if (shard_state_ == ShardState::kUnsharding) wait_for_unshard();
  TraceScope trace("FSDP::reshard", label_);
  point_params(/*unsharded=*/false);
  if (kept_after_backward_) {  // Note [Unsharded after backward]: the stash returns
    kept_after_backward_ = false;
    for (ShardedParam* p : raw_) p->accumulate_sharded_grad(at::Tensor());
  }
  {
    CopyTimer copy(stats_);
    // Note [Freeing unsharded storage]
    if (fast_) {
      util::free_storage(unsharded_flat_);
    } else {
      for (ShardedParam* p : raw_) p->free_unsharded();
    }
    buffer_pool().release(std::move(unsharded_block_));  // Note [Buffer pool]
    unsharded_block_ = PooledBlock();
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
  TraceScope trace("FSDP::summon_full_params", label_);
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
        p.local_shard().copy_(p.param().narrow(0, pl.row_offset, pl.local_rows));
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
  comm_ = nullptr;  // not recorded, not rate-limited: every replayed collective is waited
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
}

// ---- phases -----------------------------------------------------------------------------

// Prefetching: an explicit list (set_modules_to_*_prefetch) replaces the recorded order.
void ParamGroup::prefetch(const std::optional<std::vector<ParamGroup*>>& explicit_targets,
                          ParamGroup* recorded_next) {
  auto fetch = [this](ParamGroup* next) {
    if (next == nullptr || next == this) return;
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
  TraceScope trace("FSDP::pre_forward", label_);
  training_state_ = TrainingState::kForward;
  if (torch::autograd::GradMode::is_enabled()) ++graph_forward_calls_;
  if (comm_ != nullptr) comm_->record_forward(this);
  unshard(/*async_op=*/true);
  if (comm_ != nullptr && comm_->prefetch && comm_->forward_prefetch) {
    prefetch(forward_prefetch_, comm_->next_forward(this));
  }
  wait_for_unshard();
}

void ParamGroup::post_forward() {
  TraceScope trace("FSDP::post_forward", label_);
  if (comm_ != nullptr) comm_->record_post_forward(this);
  if (!torch::autograd::GradMode::is_enabled()) {
    reshard();  // no backward will follow (inference): always free
  } else if (!is_root_) {
    reshard_post_forward();
  }
  training_state_ = TrainingState::kIdle;
}

void ParamGroup::pre_backward() {
  if (training_state_ == TrainingState::kPreBackward) return;  // one hook per output node
  TraceScope trace("FSDP::pre_backward", label_);
  // The previous backward was not the last (set_is_last_backward(false)) and left this
  // group's reduce-scatter in flight: land it before stashing the gradients it updates.
  if (reduce_pending_ && comm_ != nullptr) comm_->finish_pending_reduce();
  if (reduce_pending_) finish_reduce();
  training_state_ = TrainingState::kPreBackward;
  kept_after_backward_ = false;  // a stash kept unsharded is this backward's to return
  {
    CopyTimer copy(stats_);  // accumulates onto an earlier stash (gradient accumulation)
    for (ShardedParam* p : raw_) p->stash_sharded_grad();
  }
  unshard(/*async_op=*/true);
  if (comm_ != nullptr && comm_->prefetch && comm_->backward_prefetch) {
    prefetch(backward_prefetch_, comm_->next_backward(this));
  }
  wait_for_unshard();
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
  TraceScope trace("FSDP::post_backward", label_);
  training_state_ = TrainingState::kPostBackward;
  check(shard_state_ == ShardState::kUnsharded, "post_backward", "unsharded");
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
  if (comm_ != nullptr) {
    comm_->finish_pending_reduce();
    comm_->record({CommEvent::Kind::kReduceScatter, this});
  }
  issue_reduce(grads);
  {
    CopyTimer copy(stats_);
    grads.clear();  // the unsharded gradients are in the reduce-scatter input now
  }
  ++stats_.reduce_scatters;
  reshard();
  if (comm_ != nullptr) {
    comm_->set_pending_reduce(this);
  } else {
    finish_reduce();
  }
}

// Note [Gradient averaging]
// Each rank's loss is the mean over its local batch; the reduce-scatter sums, and dividing
// by the group size gives the gradient of the mean over the global batch, as PyTorch's FSDP
// and DDP do. With HSDP the shard sums are all-reduced across replicas first (in the reduce
// dtype too: pytorch#190626), and the divisor is shard size x replicas.
void ParamGroup::finish_reduce() {
  if (!reduce_pending_) return;
  wait_work(reduce_.work, group_, stats_);
  double divisor = group_->size();
  const ProcessGroupPtr& replicas = config_.replicate_group;
  if (replicas && replicas->size() > 1) {
    if (!requires_all_reduce_) {
      hold_partial_reduce();
      return;
    }
    if (partial_reduce_.defined()) {
      CopyTimer copy(stats_);
      reduce_.output.add_(partial_reduce_);
      partial_reduce_ = at::Tensor();
    }
    TraceScope trace("FSDP::all_reduce_replicas", label_);
    ++stats_.all_reduces;
    WorkPtr work;
    {
      CommTimer issue(stats_.comm_issue_ns);
      CollectiveLabelScope label_scope(label_ + " all_reduce_replicas");
      work = all_reduce(reduce_.output, ReduceOp::SUM, replicas, /*async_op=*/true);
    }
    wait_work(work, replicas, stats_);
    divisor *= replicas->size();
  }
  divisor = gradient_divide_factor_.value_or(divisor);
  if (fast_) {
    finish_reduce_fast(divisor);
    return;
  }
  CopyTimer copy(stats_);
  reduce_.output.div_(divisor);
  for (size_t i = 0; i < raw_.size(); ++i) {
    if (!raw_[i]->requires_grad()) {
      raw_[i]->accumulate_sharded_grad(at::Tensor());
      continue;
    }
    // A copy, not a view of the output buffer: optimizers detach_() grads in zero_grad,
    // which autograd refuses on views; the buffer is freed right after.
    raw_[i]->accumulate_sharded_grad(
        reduced_shard_grad(reduce_, *raw_[i], flat_.offsets[i]).clone());
  }
  reduce_ = ReduceScatterResult();
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
  if (partial_reduce_.defined()) {
    partial_reduce_.add_(reduce_.output);
  } else {
    partial_reduce_ = reduce_.output.clone();  // the output may be a pooled or persistent buffer
  }
  for (ShardedParam* p : raw_) p->accumulate_sharded_grad(at::Tensor());
  if (fast_) {
    reduce_in_.release();
    if (!reduce_direct_) reduce_tmp_.release();
  }
  reduce_ = ReduceScatterResult();
  reduce_pending_ = false;
}

// Note [Persistent gradient buffer]
// On the fast path the sharded gradients are plain tensors over the group's persistent
// grad_flat_ (ShardedParam::grad_alias), like DDP's gradient_as_bucket_view: a gradient a
// caller keeps across steps is overwritten by the next reduce. When no stashed gradient lives
// in grad_flat_ (first step, or grads set to None) the reduce-scatter writes straight into it;
// otherwise (gradient accumulation, or zero_grad() zeroing in place as LibTorch 1.13 does) it
// writes into a pooled temporary that is then added onto the stash in place.
void ParamGroup::issue_reduce(const std::vector<at::Tensor>& grads) {
  if (!fast_) {
    reduce_ = foreach_reduce(raw_, grads, flat_, group_, label_, reduce_dtype(), stats_);
    reduce_pending_ = true;
    return;
  }
  TraceScope trace("FSDP::reduce_scatter", label_);
  reduce_direct_ = true;
  reduce_flat_add_ = grad_flat_.defined();
  if (grad_flat_.defined()) {
    const c10::StorageImpl* buffer = grad_flat_.storage().unsafeGetStorageImpl();
    for (ShardedParam* p : raw_) {
      const bool aliases = p->stash_aliases(buffer);
      reduce_direct_ = reduce_direct_ && !aliases;
      if (p->requires_grad()) reduce_flat_add_ = reduce_flat_add_ && aliases;
    }
  }
  {
    TraceScope copy_in("FSDP::reduce_scatter_copy_in", label_);
    CopyTimer copy(stats_);
    if (!grad_flat_.defined()) init_grad_buffer();
    reduce_in_.acquire();
    copy_in_grads(reduce_in_.tensor(), raw_, grads, flat_);
    if (!reduce_direct_) reduce_tmp_.acquire();
    reduce_.output = reduce_direct_ ? grad_flat_ : reduce_tmp_.tensor();
  }
  reduce_.work =
      issue_reduce_scatter(reduce_.output, reduce_in_.tensor(), group_, reduce_label_, stats_);
  reduce_pending_ = true;
}

void ParamGroup::finish_reduce_fast(double divisor) {
  CopyTimer copy(stats_);
  reduce_in_.release();
  reduce_.output.div_(divisor);
  if (reduce_direct_) {
    for (ShardedParam* p : raw_) {
      if (p->requires_grad()) {
        p->install_reduced_grad(nullptr);
      } else {
        p->accumulate_sharded_grad(at::Tensor());
      }
    }
  } else if (reduce_flat_add_) {
    // Every trainable stash is its own rows of grad_flat_: one add over the buffer (padding
    // and frozen rows add zeros), then each stash goes back as the gradient.
    grad_flat_.add_(reduce_tmp_.tensor());
    for (ShardedParam* p : raw_) p->accumulate_sharded_grad(at::Tensor());
    reduce_tmp_.release();
  } else {
    for (size_t i = 0; i < raw_.size(); ++i) {
      if (raw_[i]->requires_grad()) {
        raw_[i]->install_reduced_grad(&tmp_slices_[i]);
      } else {
        raw_[i]->accumulate_sharded_grad(at::Tensor());
      }
    }
    reduce_tmp_.release();
  }
  reduce_.output = at::Tensor();
  reduce_.work.reset();
  reduce_pending_ = false;
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

size_t ParamGroup::unsharded_block_bytes() const {
  return static_cast<size_t>(raw_.front()->layout().world * flat_.total) * element_size_;
}

size_t ParamGroup::unsharded_bytes() const {
  if (fast_) return util::storage_nbytes(unsharded_flat_);
  size_t total = 0;
  for (ShardedParam* p : raw_) total += p->unsharded_nbytes();
  return total;
}

}  // namespace tdist::fsdp::detail

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
//  post_backward : take the unsharded grads, reduce-scatter them (async), reshard.
//  finalize      : post_backward for groups autograd did not reach, wait for the last
//                  reduce-scatter, reshard everything, back to kIdle.
//
// Every verb is idempotent: calling it in the state it leads to does nothing. A verb called
// in a state it cannot leave raises (a bug in FSDP or a misuse, never silently ignored).

#include "fsdp/param_group.h"

#include <chrono>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdp/comm_context.h"
#include "fsdp/trace_scope.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void wait_work(const WorkPtr& work, const ProcessGroupPtr& group, FSDPStats& stats) {
  const int64_t begin = now_ns();
  std::chrono::milliseconds timeout = group->timeout();
  if (timeout.count() <= 0) timeout = kDefaultPgTimeout;
  work->wait(timeout);
  stats.wait_ns += now_ns() - begin;
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
                       ProcessGroupPtr group, ReshardAfterForward reshard_after_forward,
                       ProcessGroupPtr post_forward_group)
    : label_(std::move(label)),
      params_(std::move(params)),
      group_(std::move(group)),
      reshard_after_forward_(reshard_after_forward),
      post_forward_group_(std::move(post_forward_group)) {
  for (auto& p : params_) raw_.push_back(p.get());
  flat_ = FlatLayout::of(raw_);
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
  if (comm_ != nullptr) comm_->before_all_gather(this);
  if (shard_state_ == ShardState::kShardedPostForward) {
    // Note [Reshard to a smaller group]: the slab holds world/k rank blocks; gathering the
    // k slabs of the small group rebuilds the whole [world, total] buffer.
    all_gather_ =
        foreach_all_gather(raw_, flat_, post_forward_group_, label_, post_forward_slab_.view({-1}));
  } else {
    all_gather_ = foreach_all_gather(raw_, flat_, group_, label_);
  }
  shard_state_ = ShardState::kUnsharding;
  ++stats_.all_gathers;
  if (!async_op) wait_for_unshard();
}

void ParamGroup::wait_for_unshard() {
  if (shard_state_ == ShardState::kUnsharded) return;
  check(shard_state_ == ShardState::kUnsharding, "wait_for_unshard", "an unshard() first");
  wait_work(all_gather_.work, group_, stats_);
  {
    TraceScope trace("FSDP::all_gather_copy_out", label_);
    for (ShardedParam* p : raw_) p->alloc_unsharded();
    foreach_all_gather_copy_out(all_gather_, raw_, flat_);
    for (ShardedParam* p : raw_) p->use_unsharded();
  }
  all_gather_ = AllGatherResult();
  post_forward_slab_ = at::Tensor();
  shard_state_ = ShardState::kUnsharded;
  if (comm_ != nullptr) comm_->after_all_gather(this);
}

void ParamGroup::reshard() {
  if (shard_state_ == ShardState::kSharded) return;
  // Never free a buffer an all-gather may still be writing.
  if (shard_state_ == ShardState::kUnsharding) wait_for_unshard();
  TraceScope trace("FSDP::reshard", label_);
  for (ShardedParam* p : raw_) {
    p->use_sharded();
    p->free_unsharded();  // Note [Freeing unsharded storage]
  }
  post_forward_slab_ = at::Tensor();
  shard_state_ = ShardState::kSharded;
}

// Note [Reshard to a smaller group]
// reshard_after_forward = k keeps, after forward, the slab of the [world, total] all-gather
// buffer made of rank blocks [j * world/k, (j+1) * world/k), where j is this rank's index in
// its k-rank group (ranks b*k .. b*k+k-1). The k slabs of one group tile the whole buffer in
// order, so backward's all-gather runs within the small group (e.g. within a node).
void ParamGroup::reshard_post_forward() {
  const int k = reshard_after_forward_.group_size();
  const int world = group_->size();
  if (k == 1) return;  // reshard_after_forward=false: keep the parameters for backward
  if (k == 0 || k >= world || !post_forward_group_) {
    reshard();
    return;
  }
  check(shard_state_ == ShardState::kUnsharded, "reshard_post_forward", "unsharded");
  const int per = world / k;
  const int j = post_forward_group_->rank();
  at::Tensor slab = at::empty({per, flat_.total}, raw_.front()->param().options());
  for (size_t i = 0; i < raw_.size(); ++i) {
    slab.narrow(1, flat_.offsets[i], flat_.numels[i])
        .copy_(raw_[i]->padded_unsharded().view({world, flat_.numels[i]}).narrow(0, j * per, per));
  }
  reshard();
  post_forward_slab_ = std::move(slab);
  shard_state_ = ShardState::kShardedPostForward;
}

// ---- phases -----------------------------------------------------------------------------

void ParamGroup::pre_forward() {
  TraceScope trace("FSDP::pre_forward", label_);
  training_state_ = TrainingState::kForward;
  if (comm_ != nullptr) comm_->record_forward(this);
  unshard(/*async_op=*/true);
  if (comm_ != nullptr && comm_->prefetch) {
    if (ParamGroup* next = comm_->next_forward(this)) {
      if (next->shard_state_ != ShardState::kUnsharding &&
          next->shard_state_ != ShardState::kUnsharded) {
        next->unshard(/*async_op=*/true);
        ++next->stats_.prefetches;
      }
    }
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
  training_state_ = TrainingState::kPreBackward;
  for (ShardedParam* p : raw_) p->stash_sharded_grad();
  unshard(/*async_op=*/true);
  if (comm_ != nullptr && comm_->prefetch) {
    if (ParamGroup* prev = comm_->next_backward(this)) {
      if (prev->shard_state_ != ShardState::kUnsharding &&
          prev->shard_state_ != ShardState::kUnsharded) {
        prev->unshard(/*async_op=*/true);
        ++prev->stats_.prefetches;
      }
    }
  }
  wait_for_unshard();
}

void ParamGroup::post_backward() {
  if (training_state_ != TrainingState::kPreBackward) return;  // already ran this step
  TraceScope trace("FSDP::post_backward", label_);
  training_state_ = TrainingState::kPostBackward;
  check(shard_state_ == ShardState::kUnsharded, "post_backward", "unsharded");
  std::vector<at::Tensor> grads;
  grads.reserve(raw_.size());
  for (ShardedParam* p : raw_) grads.push_back(p->take_unsharded_grad());
  // Every rank whose pre-backward ran reduces (missing grads count as zeros), so ranks
  // always issue the same collectives.
  if (comm_ != nullptr) comm_->finish_pending_reduce();
  reduce_ = foreach_reduce(raw_, grads, flat_, group_, label_);
  grads.clear();  // the unsharded gradients are in the reduce-scatter input now
  reduce_pending_ = true;
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
// and DDP do.
void ParamGroup::finish_reduce() {
  if (!reduce_pending_) return;
  wait_work(reduce_.work, group_, stats_);
  reduce_.output.div_(static_cast<double>(group_->size()));
  for (size_t i = 0; i < raw_.size(); ++i) {
    // A copy, not a view of the output buffer: optimizers detach_() grads in zero_grad,
    // which autograd refuses on views; the buffer is freed right after.
    raw_[i]->accumulate_sharded_grad(
        reduced_shard_grad(reduce_, *raw_[i], flat_.offsets[i]).clone());
  }
  reduce_ = ReduceScatterResult();
  reduce_pending_ = false;
}

void ParamGroup::finalize_backward() {
  if (training_state_ == TrainingState::kPreBackward) post_backward();
  reshard();
  training_state_ = TrainingState::kIdle;
}

size_t ParamGroup::unsharded_bytes() const {
  size_t total = 0;
  for (ShardedParam* p : raw_) total += p->unsharded_nbytes();
  return total;
}

}  // namespace tdist::fsdp::detail

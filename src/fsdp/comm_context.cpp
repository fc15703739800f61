#include "fsdp/comm_context.h"

#include <algorithm>

#include "fsdp/param_group.h"

namespace tdist::fsdp::detail {

CommContext& CommContext::detached() {
  static CommContext* context = [] {
    auto* c = new CommContext();  // leaked: groups may outlive static destruction
    c->detached_ = true;
    c->prefetch = false;
    c->forward_prefetch = false;
    c->backward_prefetch = false;
    return c;
  }();
  return *context;
}

void CommContext::before_all_gather(ParamGroup* group) {
  if (detached_) return;  // Note [Detached context]: no rate limit
  // Note [All-gather rate limit]
  while (static_cast<int>(in_flight_.size()) >= std::max(1, all_gather_limit)) {
    ParamGroup* oldest = in_flight_.front();
    oldest->wait_for_unshard();  // removes it through after_all_gather
    if (!in_flight_.empty() && in_flight_.front() == oldest) in_flight_.pop_front();
  }
  in_flight_.push_back(group);
}

void CommContext::after_all_gather(ParamGroup* group) {
  auto it = std::find(in_flight_.begin(), in_flight_.end(), group);
  if (it != in_flight_.end()) in_flight_.erase(it);
}

void CommContext::set_pending_reduce(ParamGroup* group) {
  if (detached_) {  // Note [Detached context]: nothing stays pending
    group->finish_reduce();
    return;
  }
  if (pending_reduce_ != nullptr && pending_reduce_ != group) finish_pending_reduce();
  pending_reduce_ = group;
}

void CommContext::finish_pending_reduce() {
  ParamGroup* group = pending_reduce_;
  pending_reduce_ = nullptr;
  if (group != nullptr) group->finish_reduce();
}

// Note [Prefetch order]
// The first forward records the order in which groups run their pre-forward; every later
// forward prefetches the group after the current one. Backward runs modules in the reverse
// order of their *post*-forward (the root's forward ends last, so its backward starts
// first), so backward prefetches the group whose post-forward came just before.
void CommContext::record_forward(ParamGroup* group) {
  if (order_frozen_ || detached_) return;
  if (std::find(forward_order_.begin(), forward_order_.end(), group) == forward_order_.end()) {
    forward_order_.push_back(group);
  }
}

void CommContext::record_post_forward(ParamGroup* group) {
  if (order_frozen_ || detached_) return;
  if (std::find(post_forward_order_.begin(), post_forward_order_.end(), group) ==
      post_forward_order_.end()) {
    post_forward_order_.push_back(group);
  }
}

ParamGroup* CommContext::next_forward(const ParamGroup* group) const {
  if (!order_frozen_) return nullptr;
  auto it = std::find(forward_order_.begin(), forward_order_.end(), group);
  if (it == forward_order_.end() || it + 1 == forward_order_.end()) return nullptr;
  return *(it + 1);
}

ParamGroup* CommContext::next_backward(const ParamGroup* group) const {
  if (!order_frozen_) return nullptr;
  auto it = std::find(post_forward_order_.begin(), post_forward_order_.end(), group);
  if (it == post_forward_order_.end() || it == post_forward_order_.begin()) return nullptr;
  return *(it - 1);
}

}  // namespace tdist::fsdp::detail

#include "fsdp/fsdp_state.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "fsdp/autograd_hooks.h"
#include "fsdp/device_streams.h"
#include "fsdp/hook_timing.h"
#include "fsdp/registry.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {

namespace {

// Floating tensors cast to `dtype` (autograd-tracked, so gradients flow back in the
// original dtype); others untouched.
std::vector<at::Tensor> cast_floating(std::vector<at::Tensor> tensors, c10::ScalarType dtype) {
  for (auto& t : tensors) {
    if (t.defined() && t.is_floating_point() && t.scalar_type() != dtype) t = t.to(dtype);
  }
  return tensors;
}

}  // namespace

FSDPState::FSDPState(std::weak_ptr<torch::nn::Module> module, std::unique_ptr<ParamGroup> group,
                     FullyShardOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {}

void FSDPState::set_label(std::string label) {
  label_ = std::move(label);
  if (group_) group_->set_label(label_);
}

void FSDPState::set_materialized_group(std::unique_ptr<ParamGroup> group) {
  deferred_.reset();
  group_ = std::move(group);
  if (group_) group_->set_label(label_);
}

void FSDPState::throw_not_materialized() const {
  TDIST_THROW(InvalidArgument,
              "FSDP: the parameters of '" + label_ +
                  "' were built on the meta device and hold no data yet; call "
                  "tdist::fsdp::materialize(model, MaterializeOptions().device(...).seed(...)) "
                  "after fully_shard and before forward, state_dict or the FSDPModule setters");
}

FSDPState* FSDPState::top() const {
  const FSDPState* s = this;
  while (s->parent_ != nullptr) s = s->parent_;
  return const_cast<FSDPState*>(s);
}

// The first state whose forward runs with no FSDP ancestor is the root: it owns the comm
// context that every group in its tree shares, and finishes backward.
void FSDPState::lazy_init() {
  auto module = module_.lock();
  if (!module) TDIST_THROW(Error, "FSDP: the module of '" + label_ + "' no longer exists");
  if (module_count_ > 1) {
    TDIST_THROW(InvalidArgument,
                "FSDP: the " + std::to_string(module_count_) +
                    " modules sharded together by one fully_shard call ran forward with no "
                    "fully_shard'ed module above them; apply fully_shard to the model as well "
                    "(its root), after the grouped call, and call the model through "
                    "tdist::fsdp::forward");
  }
  is_root_ = true;
  comm_ = std::make_unique<CommContext>();
  comm_->all_gather_limit = options_.all_gather_limit();
  comm_->prefetch = options_.prefetch();
  comm_->forward_prefetch = options_.forward_prefetch();
  comm_->backward_prefetch = options_.backward_prefetch();
  tree_.clear();
  // Module order is the same on every rank, so tree_ (and the order of the collectives
  // the end-of-backward callback issues) is too.
  for (const auto& m : module->modules(/*include_self=*/true)) {
    FSDPState* s = find_state(*m);
    if (s == nullptr || s->top() != this) continue;
    if (std::find(tree_.begin(), tree_.end(), s) != tree_.end()) continue;  // grouped modules
    if (s->deferred_) s->throw_not_materialized();
    tree_.push_back(s);
    s->initialized_ = true;
    if (s->group_) {
      s->group_->set_comm_context(*comm_);
      s->group_->set_is_root(s == this);
      if (comm_->streams == nullptr) comm_->streams = s->group_->streams();
    }
  }
}

// Note [FSDP streams]: the shards were last written by the optimizer step, and nothing else
// writes them until the next one; so, as FSDP2's root pre-forward, the copy-in stream waits
// once per forward, on the user's post-optimizer event when there is one, else on the compute
// stream, and the all-gathers of this forward and its backward need no wait of their own.
void FSDPState::order_all_gather_inputs() {
  const std::shared_ptr<c10::Event> event = std::move(post_optim_event_);  // used once
  DeviceStreams* streams = comm_->streams;
  if (streams == nullptr) return;
  if (event) {
    streams->wait_event(StreamRole::kAllGatherCopyIn, *event);
  } else {
    streams->wait(StreamRole::kAllGatherCopyIn, StreamRole::kCompute);
  }
  comm_->all_gather_inputs_ordered = true;
}

std::vector<at::Tensor> FSDPState::pre_forward(std::vector<at::Tensor> inputs) {
  HookTimer timer(stats());
  FSDPState* root = top();
  if (root != this && !root->in_forward_) {
    TDIST_THROW(Error, "FSDP: module '" + label_ +
                           "' was called through tdist::fsdp::forward while its root "
                           "fully_shard'ed module was not in forward. Call the root as "
                           "tdist::fsdp::forward(model, ...), not model->forward(...)");
  }
  if (root == this) {
    // Tell ranks that joined (ran out of data) that this one trains another step.
    if (joinable_ != nullptr && torch::autograd::GradMode::is_enabled()) {
      join::Join::notify_join_context(*joinable_);
    }
    if (!initialized_) lazy_init();
    order_all_gather_inputs();
    if (torch::autograd::GradMode::is_enabled()) comm_->begin_step();
    in_forward_ = true;
    for (FSDPState* s : tree_) s->ran_forward_this_step_ = false;
  }
  ran_forward_this_step_ = true;
  if (group_) group_->pre_forward();
  const MixedPrecisionPolicy& mp = options_.mp_policy();
  if (mp.cast_forward_inputs() && mp.param_dtype()) {
    CopyTimer copy(stats());
    inputs = cast_floating(std::move(inputs), *mp.param_dtype());
  }
  if (torch::autograd::GradMode::is_enabled()) {
    inputs = register_post_backward(this, std::move(inputs));
  }
  return inputs;
}

std::vector<at::Tensor> FSDPState::post_forward(std::vector<at::Tensor> outputs) {
  HookTimer timer(stats());
  if (group_) group_->post_forward();
  if (const auto& dtype = options_.mp_policy().output_dtype()) {
    CopyTimer copy(stats());
    outputs = cast_floating(std::move(outputs), *dtype);
  }
  const bool grad = torch::autograd::GradMode::is_enabled();
  if (grad) outputs = register_pre_backward(this, std::move(outputs));
  if (is_root_) {
    in_forward_ = false;
    if (!grad) comm_->all_gather_inputs_ordered = false;  // no backward follows
    if (!comm_->order_frozen()) comm_->freeze_order();
    // Note [Bypass check]: once, on the first forward that builds a graph.
    if (grad && !bypass_checked_) {
      bypass_checked_ = true;
      check_no_bypass(outputs);
    }
  }
  return outputs;
}

void FSDPState::pre_backward() {
  HookTimer timer(stats());
  FSDPState* root = top();
  if (!root->callback_queued_) {
    root->callback_queued_ = true;
    queue_end_of_backward_callback([root] { root->root_post_backward_final_callback(); });
  }
  if (group_) group_->pre_backward();
}

void FSDPState::post_backward() {
  HookTimer timer(stats());
  if (group_) group_->post_backward();
}

void FSDPState::root_post_backward_final_callback() {
  HookTimer timer(stats());
  callback_queued_ = false;
  for (FSDPState* s : tree_) {
    if (s->group_) s->group_->finalize_backward();
  }
  // Not the last backward: the last reduce-scatter stays in flight; its group finishes it
  // at its next pre-backward (ParamGroup::pre_backward), before it stashes gradients.
  if (is_last_backward_) comm_->finish_pending_reduce();
  comm_->end_step();
  comm_->all_gather_inputs_ordered = false;  // the optimizer step comes next
  // Note [FSDP streams]: what runs after backward (the optimizer) sees the installed
  // gradients.
  for (FSDPState* s : tree_) {
    if (s->group_) s->group_->join_reduce_stream();
  }
}

// Note [Bypass check]
// A sharded module called as block(x) or block->forward(x) instead of through
// tdist::fsdp::forward would compute on its shards. Its parameters then reach the autograd
// graph without its pre-forward having run; the root checks this on the first forward
// (shapes are the same every step) and raises, naming the parameter and the fix.
void FSDPState::check_no_bypass(const std::vector<at::Tensor>& outputs) const {
  std::unordered_map<const c10::TensorImpl*, std::pair<const FSDPState*, std::string>> owner;
  for (const FSDPState* s : tree_) {
    if (!s->group_) continue;
    for (const auto& p : s->group_->params()) {
      owner[p->param().unsafeGetTensorImpl()] = {s, p->fqn()};
    }
  }
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<torch::autograd::Node*> seen;
  for (const auto& t : outputs) {
    if (t.defined() && t.grad_fn()) stack.push_back(t.grad_fn().get());
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      auto it = owner.find(acc->variable.unsafeGetTensorImpl());
      if (it != owner.end() && !it->second.first->ran_forward_this_step_) {
        const std::string& module = it->second.first->label_;
        TDIST_THROW(Error, "FSDP: parameter '" + it->second.second + "' of sharded module '" +
                               module +
                               "' was used in forward while sharded: the module was called "
                               "bypassing FSDP (block(x) or block->forward(x)). Call it as "
                               "tdist::fsdp::forward(block, x)");
      }
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
}

}  // namespace tdist::fsdp::detail

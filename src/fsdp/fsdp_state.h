#pragma once

// FSDPState: one per fully_shard'ed module. Owns root detection, lazy init and the hook
// entry points; each hook only calls ParamGroup verbs (see param_group.cpp).

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "fsdp/comm_context.h"
#include "fsdp/group_builder.h"
#include "fsdp/param_group.h"
#include "tdist/fsdp/policies.h"
#include "tdist/join/join.h"

namespace tdist::fsdp::detail {

class FSDPState {
 public:
  FSDPState(std::weak_ptr<torch::nn::Module> module, std::unique_ptr<ParamGroup> group,
            FullyShardOptions options);

  const std::string& label() const { return label_; }
  void set_label(std::string label);
  /// Its parameters' group (null: it manages none). Throws while they await materialize.
  ParamGroup* group() const {
    if (deferred_) throw_not_materialized();
    return group_.get();
  }
  // ---- Note [Deferred init] ----
  /// fully_shard of meta parameters: the group is built by materialize, from `plan`.
  void defer_group(GroupPlan plan) { deferred_ = std::make_unique<GroupPlan>(std::move(plan)); }
  /// The plan of a group awaiting materialize (null once built, or when there was none).
  GroupPlan* deferred_group() const { return deferred_.get(); }
  /// Installs the group materialize built from the deferred plan.
  void set_materialized_group(std::unique_ptr<ParamGroup> group);
  FSDPState* parent() const { return parent_; }
  void set_parent(FSDPState* parent) { parent_ = parent; }
  const std::weak_ptr<torch::nn::Module>& module() const { return module_; }
  FSDPStats& stats() { return group_ ? group_->stats() : stats_; }
  // As FSDP2, where every module of a tree shares one state context: set on any module of
  // the tree, they are the root's (its forward and its end of backward read them).
  void set_is_last_backward(bool last) { top()->is_last_backward_ = last; }
  void set_post_optim_event(std::shared_ptr<c10::Event> event) {
    top()->post_optim_event_ = std::move(event);
  }
  /// fully_shard over several modules: this state is theirs (the first is module()).
  void set_module_count(size_t count) { module_count_ = count; }
  bool is_root() const { return is_root_; }
  /// The root's comm context once its first forward made it the root; Note [Detached
  /// context] before that, and on non-roots.
  CommContext& comm() const { return comm_ ? *comm_ : CommContext::detached(); }
  /// Join for FSDP: the root notifies the join context at each pre-forward.
  void set_joinable(join::Joinable* joinable) { joinable_ = joinable; }

  // ---- hook entry points ----
  std::vector<at::Tensor> pre_forward(std::vector<at::Tensor> inputs);
  std::vector<at::Tensor> post_forward(std::vector<at::Tensor> outputs);
  void pre_backward();   // from autograd, before the module's backward
  void post_backward();  // from autograd, once the module's input grads are computed
  void root_post_backward_final_callback();

 private:
  void lazy_init();
  void order_all_gather_inputs();
  [[noreturn]] void throw_not_materialized() const;
  FSDPState* top() const;
  void check_no_bypass(const std::vector<at::Tensor>& outputs) const;

  std::weak_ptr<torch::nn::Module> module_;
  std::unique_ptr<ParamGroup> group_;
  std::unique_ptr<GroupPlan> deferred_;  // set from fully_shard of meta params to materialize
  FullyShardOptions options_;
  std::string label_;
  FSDPState* parent_ = nullptr;  // the fully_shard'ed module containing this one

  // Set by lazy_init on the root only.
  bool initialized_ = false;
  bool is_root_ = false;
  std::vector<FSDPState*> tree_;  // every state under the root, the root included
  std::unique_ptr<CommContext> comm_;
  bool in_forward_ = false;
  bool callback_queued_ = false;
  bool is_last_backward_ = true;
  std::shared_ptr<c10::Event> post_optim_event_;  // for the root's next forward
  size_t module_count_ = 1;
  bool bypass_checked_ = false;
  bool ran_forward_this_step_ = false;
  FSDPStats stats_;  // used when the module has no own parameters
  join::Joinable* joinable_ = nullptr;
};

}  // namespace tdist::fsdp::detail

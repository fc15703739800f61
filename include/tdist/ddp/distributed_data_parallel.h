#pragma once

// DistributedDataParallel for LibTorch modules (torch.nn.parallel.DistributedDataParallel).
//
// C++ modules have no common forward signature and no forward hooks, so the model's forward
// runs *through* the wrapper, which knows the module's type:
//
//   auto net = std::make_shared<Net>();                       // or a ModuleHolder (Linear...)
//   tdist::ddp::DistributedDataParallel ddp(net);             // broadcasts rank 0's state
//   torch::optim::SGD opt(net->parameters(), 0.1);
//   auto loss = torch::mse_loss(ddp.forward(x), y);           // or ddp(x)
//   loss.backward();                                          // returns with averaged grads
//   opt.step();
//
// forward(args...) does DDP's per-iteration work (buffer broadcast, Join notification, arming
// the gradient reducer) and then calls the module's forward(args...), as FSDP1's
// FullyShardedDataParallel does. Calling the module directly skips it: the next backward then
// does not synchronise (as under no_sync()).
//
// Gradients are all-reduced in buckets (Note [DDP bucket order] in bucketing.h) from
// autograd post hooks, so each bucket's communication overlaps the rest of backward.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "tdist/arg.h"
#include "tdist/comm/process_group.h"
#include "tdist/ddp/comm_hooks.h"
#include "tdist/error.h"
#include "tdist/join/join.h"
#include "tdist/mesh/device_mesh.h"

namespace tdist::ddp {

namespace detail {
class Reducer;
}

struct DistributedDataParallelOptions {
  /// The group gradients are averaged over; null: the world.
  TDIST_ARG(ProcessGroupPtr, process_group) = nullptr;
  /// A 1-D device mesh to replicate over, in place of process_group (not both): its group.
  TDIST_ARG(std::optional<mesh::DeviceMesh>, device_mesh) = std::nullopt;
  /// Size of every bucket but the first, in MiB.
  TDIST_ARG(double, bucket_cap_mb) = 25.0;
  /// Size of the first bucket (the first to become ready in backward), in MiB.
  TDIST_ARG(double, first_bucket_cap_mb) = 1.0;
  /// Broadcast the module's buffers from rank 0 at the start of every forward.
  TDIST_ARG(bool, broadcast_buffers) = true;
  /// Allow parameters that get no gradient in some iterations (costs one extra small
  /// all-reduce per iteration). Parameters unused on every rank keep their .grad as is.
  TDIST_ARG(bool, find_unused_parameters) = false;
  /// The set of parameters that get gradients is the same every iteration (Note [Static
  /// graph]): the first iteration records it (parameters unused on some or every rank are
  /// then allowed, as with find_unused_parameters); later iterations skip the
  /// used-parameter all-reduce, and a graph that changes is an error naming the parameter.
  /// Unlike PyTorch's, no reentrant backward (reentrant activation checkpointing) either.
  TDIST_ARG(bool, static_graph) = false;
  /// Make each .grad a view into its bucket after the first reduction (saves two copies
  /// per step; .grad then aliases DDP's buffers, as in PyTorch).
  TDIST_ARG(bool, gradient_as_bucket_view) = false;
};

namespace detail {

inline std::shared_ptr<torch::nn::Module> module_ptr(const std::shared_ptr<torch::nn::Module>& m) {
  return m;
}
template <class Impl>
std::shared_ptr<torch::nn::Module> module_ptr(const std::shared_ptr<Impl>& m) {
  return std::static_pointer_cast<torch::nn::Module>(m);
}
template <class Impl>
std::shared_ptr<torch::nn::Module> module_ptr(const torch::nn::ModuleHolder<Impl>& m) {
  return std::static_pointer_cast<torch::nn::Module>(m.ptr());
}

/// The type-independent part of DistributedDataParallel (everything but forward).
class DistributedDataParallelBase : public join::Joinable {
 public:
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                              DistributedDataParallelOptions options);
  ~DistributedDataParallelBase() override;
  DistributedDataParallelBase(const DistributedDataParallelBase&) = delete;
  DistributedDataParallelBase& operator=(const DistributedDataParallelBase&) = delete;

  /// The wrapped module, type-erased.
  const std::shared_ptr<torch::nn::Module>& module_base() const { return module_; }
  std::vector<at::Tensor> parameters() const { return module_->parameters(); }
  const ProcessGroupPtr& process_group() const { return group_; }

  /// RAII guard from no_sync(): while alive, forward/backward accumulate gradients locally
  /// without communication; the first synchronised backward after it reduces the sum.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallelBase* ddp);
    NoSync(NoSync&& other) noexcept;
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;
    ~NoSync();

   private:
    DistributedDataParallelBase* ddp_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(this); }
  bool require_backward_grad_sync() const { return require_backward_grad_sync_; }

  /// Replaces the default all-reduce with `hook` (once, before the first backward).
  void register_comm_hook(CommHook hook);
  /// Python's register_comm_hook(state, hook): `hook(*state, bucket)` for every bucket, e.g.
  /// `register_comm_hook(power_sgd_state, tdist::ddp::powerSGD_hook)`.
  template <class State>
  void register_comm_hook(std::shared_ptr<State> state,
                          CommHookFuture (*hook)(State&, GradBucket&)) {
    TDIST_CHECK_ARG(state != nullptr && hook != nullptr,
                    "DDP: register_comm_hook(state, hook) needs a state and a hook");
    register_comm_hook(
        [state = std::move(state), hook](GradBucket& bucket) { return hook(*state, bucket); });
  }

  /// Parameter indices (into parameters() filtered to requires_grad) per bucket, in the
  /// order buckets are reduced.
  const std::vector<std::vector<size_t>>& bucket_indices() const { return bucket_indices_; }

  // Joinable. join_hook kwargs: "divide_by_initial_world_size" (bool, default true):
  // while some ranks have joined, divide gradients by the initial world size (true) or by
  // the number of ranks still training (false).
  std::unique_ptr<join::JoinHook> join_hook(const join::JoinKwargs& kwargs) override;
  c10::Device join_device() const override;
  ProcessGroupPtr join_process_group() const override { return group_; }

 protected:
  /// DDP's per-iteration work before the module's forward.
  void pre_forward();

 private:
  friend class DDPJoinHook;

  void verify_parameters_across_ranks() const;
  /// All-reduce MAX of (active ? rank : -1): the highest active rank (Join bookkeeping).
  int find_common_rank(bool active) const;
  /// All-reduce of how many ranks want to synchronise gradients this iteration.
  int global_grad_sync_count(bool wants_sync) const;
  void sync_buffers(int src) const;
  /// Join: shadow one iteration of the ranks still training.
  void joined_iteration();
  /// Join: after every rank joined, copy the last joiner's state everywhere.
  void sync_final_model(bool is_last_joiner);

  std::shared_ptr<torch::nn::Module> module_;
  DistributedDataParallelOptions options_;
  ProcessGroupPtr group_;
  std::vector<at::Tensor> params_;  // requires_grad parameters, registration order
  std::vector<std::string> param_names_;
  std::vector<at::Tensor> buffers_;
  std::vector<std::vector<size_t>> bucket_indices_;
  std::shared_ptr<detail::Reducer> reducer_;
  bool require_backward_grad_sync_ = true;
  bool divide_by_initial_world_size_ = true;
};

}  // namespace detail

/// DDP over a module `M` (a ModuleHolder such as torch::nn::Linear, or a std::shared_ptr to
/// the Impl; deduced from the constructor's argument). Construction is collective: it checks
/// parameter shapes across ranks and broadcasts rank 0's parameters and buffers.
template <class M>
class DistributedDataParallel : public detail::DistributedDataParallelBase {
 public:
  explicit DistributedDataParallel(M module, DistributedDataParallelOptions options = {})
      : detail::DistributedDataParallelBase(detail::module_ptr(module), std::move(options)),
        module_(std::move(module)) {}

  /// One training forward: DDP's per-iteration work, then the module's forward(args...).
  template <class... Args>
  auto forward(Args&&... args) {
    pre_forward();
    return module_->forward(std::forward<Args>(args)...);
  }
  template <class... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  /// Another method of the module run as the training forward (as FSDP2's
  /// tdist::fsdp::forward_method): DDP's per-iteration work, then (*module().*method)(args...).
  template <class Method, class... Args>
  auto forward_method(Method method, Args&&... args) {
    pre_forward();
    return ((*module_).*method)(std::forward<Args>(args)...);
  }

  /// The wrapped module.
  M& module() { return module_; }
  const M& module() const { return module_; }

 private:
  M module_;
};

}  // namespace tdist::ddp

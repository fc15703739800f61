#pragma once

// Activation checkpointing of a (sharded) module: tdist::fsdp::checkpointed_forward(block, x)
// is tdist::fsdp::forward(block, x) that keeps no activations of the block; its backward runs
// the block's forward again, with grad, and backpropagates through it.
//
//   for (auto& block : blocks) x = tdist::fsdp::checkpointed_forward(block, x);  // was: forward
//
// torch.utils.checkpoint.checkpoint(function, *args) as a call-site wrapper, as
// tdist::fsdp::forward is (LibTorch modules have no hooks a checkpoint_wrapper could use). Not
// called `checkpoint`: that is the distributed-checkpoint area (tdist::checkpoint).
//
// Composition with FSDP (as PyTorch's FSDP(checkpoint_wrapper(block))): FSDP's hooks sit
// outside the checkpoint. Forward: pre-forward unshards, the block runs without saving
// activations (no_grad), post-forward reshards. Backward: FSDP's pre-backward unshards the
// block again, the checkpoint recomputes its forward on those full parameters and
// backpropagates (the parameters' unsharded gradients accumulate), then FSDP's post-backward
// reduce-scatters them. So a checkpointed block all-gathers as often as a plain one.
//
// Semantics of torch.utils.checkpoint(use_reentrant=True): the recompute runs a nested
// backward; the forward's RNG states (the CPU generator's and that of each CUDA device an
// input is on) are restored for the recompute, so dropout masks match. Under NoGradGuard it is a
// plain tdist::fsdp::forward. Limits: the block's forward must not call fully_shard'ed submodules
// (their FSDP pre-forward cannot run inside backward), and torch::autograd::grad() (not backward())
// does not reach parameters through a checkpoint, as in PyTorch's reentrant variant.

#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "tdist/fsdp/forward.h"

namespace tdist::fsdp {

namespace detail {

/// Runs the block on these tensors (in place of the tensor arguments), returns its
/// flattened tensor outputs.
using CheckpointRun = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// The checkpoint autograd function: run(inputs) without grad now, again with grad in
/// backward. Returns the outputs (requiring grad when grad mode is on).
std::vector<at::Tensor> checkpoint_apply(CheckpointRun run, const std::vector<at::Tensor>& inputs);

/// True when grad mode is on (kept out of this header's includes).
bool grad_mode_enabled();

template <class Impl>
std::shared_ptr<Impl> module_shared_ptr(const torch::nn::ModuleHolder<Impl>& module) {
  return module.ptr();
}
template <class Impl>
std::shared_ptr<Impl> module_shared_ptr(const std::shared_ptr<Impl>& module) {
  return module;
}

template <class T, std::enable_if_t<is_tensor<T>::value, int> = 0>
const at::Tensor& substitute(const std::vector<at::Tensor>& tensors, size_t& next, const T&) {
  return tensors[next++];
}
template <class T, std::enable_if_t<!is_tensor<T>::value, int> = 0>
const T& substitute(const std::vector<at::Tensor>&, size_t&, const T& value) {
  return value;
}

}  // namespace detail

/// tdist::fsdp::forward(module, args...) with activation checkpointing (see above).
/// Non-tensor arguments are copied and passed again to the recompute.
template <class M, class... Args>
auto checkpointed_forward(M& module, Args&&... args) {
  if (!detail::grad_mode_enabled())
    return tdist::fsdp::forward(module, std::forward<Args>(args)...);
  using Output = std::decay_t<decltype(module->forward(std::forward<Args>(args)...))>;
  using Out = detail::Outputs<Output>;
  detail::FSDPState* state =
      detail::find_state(static_cast<const torch::nn::Module&>(*module.get()));
  std::vector<at::Tensor> inputs;
  (detail::collect(inputs, args), ...);
  if (state != nullptr) inputs = detail::run_pre_forward(*state, std::move(inputs));

  auto values = std::make_shared<std::tuple<std::decay_t<Args>...>>(std::forward<Args>(args)...);
  // The first run's output keeps the non-tensor parts of the result; the recompute's is
  // dropped once flattened.
  auto first = std::make_shared<std::optional<Output>>();
  auto held = detail::module_shared_ptr(module);  // alive as long as the graph needs it
  detail::CheckpointRun run = [held, values, first,
                               ran = false](const std::vector<at::Tensor>& tensors) mutable {
    size_t next = 0;
    Output out = std::apply(
        [&](const auto&... a) {
          // Braced initialisation evaluates left to right, so tensors are taken in order.
          std::tuple<decltype(detail::substitute(tensors, next, a))...> call_args{
              detail::substitute(tensors, next, a)...};
          return std::apply([&](const auto&... b) { return held->forward(b...); }, call_args);
        },
        *values);
    std::vector<at::Tensor> flat;
    Out::collect(flat, out);
    if (!ran) *first = std::move(out);
    ran = true;
    return flat;
  };
  std::vector<at::Tensor> outputs = detail::checkpoint_apply(std::move(run), inputs);
  Output result = std::move(**first);
  first->reset();
  if (state != nullptr) outputs = detail::run_post_forward(*state, std::move(outputs));
  size_t put = 0;
  Out::put_back(outputs, put, result);
  return result;
}

}  // namespace tdist::fsdp

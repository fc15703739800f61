#include "fsdp/autograd_hooks.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include "fsdp/fsdp_state.h"

namespace tdist::fsdp::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool any_requires_grad(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

FSDPState* state_from(AutogradContext* ctx) {
  return reinterpret_cast<FSDPState*>(ctx->saved_data["state"].toInt());
}

struct PreBackward : public torch::autograd::Function<PreBackward> {
  static variable_list forward(AutogradContext* ctx, int64_t state, at::TensorList outputs) {
    ctx->saved_data["state"] = state;
    return variable_list(outputs.begin(), outputs.end());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    state_from(ctx)->pre_backward();
    variable_list out;
    out.reserve(grads.size() + 1);
    out.emplace_back();  // for the int64 argument
    for (auto& g : grads) out.push_back(std::move(g));
    return out;
  }
};

struct PostBackward : public torch::autograd::Function<PostBackward> {
  static variable_list forward(AutogradContext* ctx, int64_t state, at::TensorList inputs) {
    ctx->saved_data["state"] = state;
    return variable_list(inputs.begin(), inputs.end());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    state_from(ctx)->post_backward();
    variable_list out;
    out.reserve(grads.size() + 1);
    out.emplace_back();
    for (auto& g : grads) out.push_back(std::move(g));
    return out;
  }
};

}  // namespace

std::vector<at::Tensor> register_pre_backward(FSDPState* state, std::vector<at::Tensor> outputs) {
  if (!any_requires_grad(outputs)) return outputs;
  // A TensorList (not a std::vector) so that autograd sees each element as an input.
  return PreBackward::apply(reinterpret_cast<int64_t>(state), at::TensorList(outputs));
}

std::vector<at::Tensor> register_post_backward(FSDPState* state, std::vector<at::Tensor> inputs) {
  if (!any_requires_grad(inputs)) return inputs;
  return PostBackward::apply(reinterpret_cast<int64_t>(state), at::TensorList(inputs));
}

void queue_end_of_backward_callback(std::function<void()> fn) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

}  // namespace tdist::fsdp::detail

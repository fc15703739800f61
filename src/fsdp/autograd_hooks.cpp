#include "fsdp/autograd_hooks.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include "fsdp/fsdp_state.h"

namespace tdist::fsdp::detail {

namespace {

using torch::autograd::edge_list;
using torch::autograd::variable_list;

// Note [Boundary nodes]
// The identity node FSDP threads a module's boundary tensors through (Note [Backward hooks]).
// A plain Node rather than a torch::autograd::Function: apply() would also build an
// AutogradContext (a string-keyed map for the state pointer), record per-input metadata
// for output validation, handle forward-mode AD and materialise undefined gradients as
// zeros, none of which an identity needs. Each boundary tensor is replaced by an alias made
// under no-grad (exactly what Function::apply does for an input returned unchanged) whose
// gradient edge points at the node; the node's next edges are the tensors' own edges.
class BoundaryNode final : public torch::autograd::Node {
 public:
  BoundaryNode(FSDPState* state, bool pre_backward, edge_list&& next_edges)
      : Node(std::move(next_edges)), state_(state), pre_backward_(pre_backward) {}

  variable_list apply(variable_list&& grads) override {
    if (pre_backward_) {
      state_->pre_backward();
    } else {
      state_->post_backward();
    }
    return std::move(grads);
  }

  std::string name() const override {
    return pre_backward_ ? "tdist::fsdp::PreBackward" : "tdist::fsdp::PostBackward";
  }

 private:
  FSDPState* state_;
  bool pre_backward_;
};

std::vector<at::Tensor> thread_through_node(FSDPState* state, bool pre_backward,
                                            std::vector<at::Tensor> tensors) {
  edge_list next_edges;
  for (const auto& t : tensors) {
    if (t.defined() && t.requires_grad()) {
      next_edges.push_back(torch::autograd::impl::gradient_edge(t));
    }
  }
  if (next_edges.empty()) return tensors;
  std::shared_ptr<BoundaryNode> node(new BoundaryNode(state, pre_backward, std::move(next_edges)),
                                     torch::autograd::deleteNode);
  for (auto& t : tensors) {
    if (!t.defined() || !t.requires_grad()) continue;
    at::Tensor alias;
    {
      at::AutoGradMode no_grad(false);
      alias = t.view_as(t);
    }
    torch::autograd::create_gradient_edge(alias, node);
    t = std::move(alias);
  }
  return tensors;
}

}  // namespace

std::vector<at::Tensor> register_pre_backward(FSDPState* state, std::vector<at::Tensor> outputs) {
  return thread_through_node(state, /*pre_backward=*/true, std::move(outputs));
}

std::vector<at::Tensor> register_post_backward(FSDPState* state, std::vector<at::Tensor> inputs) {
  return thread_through_node(state, /*pre_backward=*/false, std::move(inputs));
}

void queue_end_of_backward_callback(std::function<void()> fn) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

}  // namespace tdist::fsdp::detail

#include "fsdp/autograd_hooks.h"

#include <typeinfo>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include "fsdp/fsdp_state.h"
#include "tdist/detail/util/torch_compat.h"

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

// Note [Boundary aliases]
// The alias a boundary tensor is replaced by: a new TensorImpl over the same storage, sizes,
// strides and offset, sharing the tensor's version counter (so autograd's saved-tensor checks
// still see in-place writes through it), built directly instead of with view_as, whose
// dispatch and view tracking cost ~20 us per tensor on LibTorch 1.13 CPU (measured inside
// FSDP's hooks, bench/HISTORY.md). It is not an autograd view of the tensor: an
// in-place op on it rebases its own history onto the boundary node, which is what a view made
// under no-grad would refuse. A tensor that is itself an autograd view takes view_as too: an
// in-place op through an alias autograd does not know as its view would bypass the
// rebasing of the base's history, and gradients through the base would silently be wrong.
// So do tensors sharing storage with another tensor of the same boundary (one may be the
// other's base), and anything but a plain strided TensorImpl.
at::Tensor boundary_alias(const at::Tensor& t, bool shares_storage) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (shares_storage || typeid(*impl) != typeid(c10::TensorImpl) || !impl->has_storage() ||
      t.layout() != c10::kStrided || t.is_view()) {
    at::AutoGradMode no_grad(false);
    return t.view_as(t);
  }
  at::Tensor alias = util::alias_storage(t, impl->sizes(), impl->strides(), impl->storage_offset());
  alias.unsafeGetTensorImpl()->set_version_counter(impl->version_counter());
  return alias;
}

// Whether two of the tensors that get an alias share a storage (Note [Boundary aliases]).
bool aliased_tensors_share_storage(const std::vector<at::Tensor>& tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined() || !tensors[i].requires_grad() || !tensors[i].has_storage()) continue;
    for (size_t j = i + 1; j < tensors.size(); ++j) {
      if (tensors[j].defined() && tensors[j].requires_grad() && tensors[j].has_storage() &&
          tensors[i].storage().is_alias_of(tensors[j].storage())) {
        return true;
      }
    }
  }
  return false;
}

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
  const bool shares_storage = aliased_tensors_share_storage(tensors);
  for (auto& t : tensors) {
    if (!t.defined() || !t.requires_grad()) continue;
    at::Tensor alias = boundary_alias(t, shares_storage);
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

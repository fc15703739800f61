// The checkpoint autograd function (torch.utils.checkpoint's reentrant CheckpointFunction,
// in LibTorch): forward runs the block under no_grad and saves only its inputs; backward
// restores the RNG states (CPU, and each input's accelerator), recomputes the block with grad on
// detached inputs and runs a nested backward through it. FSDP's hooks stay outside (see
// activation_checkpoint.h).

#include "tdist/fsdp/activation_checkpoint.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "tdist/detail/util/torch_compat.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The generators a recompute must replay: the CPU's and (as torch.utils.checkpoint's
// preserve_rng_state) the default generator of each accelerator device an input is on, since
// dropout on CUDA tensors draws from the CUDA generator.
std::vector<c10::Device> rng_devices(at::TensorList inputs) {
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  for (const at::Tensor& t : inputs) {
    if (!t.defined() || t.device().is_meta()) continue;
    if (std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

/// Each device's generator state, in the order of `devices`.
using RngStates = std::vector<std::pair<c10::Device, at::Tensor>>;

RngStates get_rng_states(const std::vector<c10::Device>& devices) {
  RngStates states;
  for (const c10::Device& device : devices) {
    states.emplace_back(device, util::generator_state(device));
  }
  return states;
}

void set_rng_states(const RngStates& states) {
  for (const auto& [device, state] : states) util::set_generator_state(device, state);
}

// What the backward needs besides the saved inputs, kept in the context as a capsule.
struct CheckpointState : public torch::CustomClassHolder {
  CheckpointRun run;
  RngStates rng_states;
  size_t num_inputs = 0;  // real inputs (a dummy may follow)
};

// Restores the forward's RNG states for the recompute, and the current ones afterwards.
class ForkRng {
 public:
  explicit ForkRng(const RngStates& forward) {
    for (const auto& entry : forward)
      saved_.emplace_back(entry.first, util::generator_state(entry.first));
    set_rng_states(forward);
  }
  ~ForkRng() { set_rng_states(saved_); }
  ForkRng(const ForkRng&) = delete;
  ForkRng& operator=(const ForkRng&) = delete;

 private:
  RngStates saved_;
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, c10::IValue capsule, at::TensorList inputs) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(capsule.toCapsule());
    state->rng_states = get_rng_states(rng_devices(inputs));
    ctx->saved_data["state"] = capsule;
    ctx->save_for_backward(variable_list(inputs.begin(), inputs.end()));
    std::vector<at::Tensor> real(inputs.begin(), inputs.begin() + state->num_inputs);
    return state->run(real);  // grad mode is off inside Function::forward
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state =
        c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> detached;
    detached.reserve(state->num_inputs);
    for (size_t i = 0; i < state->num_inputs; ++i) {
      const at::Tensor& t = saved[i];
      if (!t.defined()) {
        detached.push_back(t);
        continue;
      }
      at::Tensor d = t.detach();
      d.requires_grad_(t.requires_grad());
      detached.push_back(std::move(d));
    }
    std::vector<at::Tensor> outputs;
    {
      ForkRng rng(state->rng_states);
      at::AutoGradMode grad(true);
      outputs = state->run(detached);
    }
    TDIST_CHECK_ARG(outputs.size() == grad_outputs.size(),
                    "tdist::fsdp::checkpointed_forward: the recompute returned " +
                        std::to_string(outputs.size()) + " tensors, the forward " +
                        std::to_string(grad_outputs.size()) +
                        "; the block's forward must be deterministic in structure");
    std::vector<at::Tensor> roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    variable_list result;
    result.reserve(saved.size() + 1);
    result.emplace_back();  // the capsule
    for (size_t i = 0; i < saved.size(); ++i) {
      result.push_back(i < detached.size() && detached[i].defined() && detached[i].requires_grad()
                           ? detached[i].grad()
                           : at::Tensor());
    }
    return result;
  }
};

}  // namespace

bool grad_mode_enabled() {
  return at::GradMode::is_enabled();
}

std::vector<at::Tensor> checkpoint_apply(CheckpointRun run, const std::vector<at::Tensor>& inputs) {
  auto state = c10::make_intrusive<CheckpointState>();
  state->run = std::move(run);
  state->num_inputs = inputs.size();
  std::vector<at::Tensor> all = inputs;
  bool any = false;
  for (const auto& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) {
    // Parameters are not inputs of the function: without an input requiring grad its
    // outputs would not either, and backward would never reach the block's parameters.
    all.push_back(at::empty({0}).requires_grad_(true));
  }
  return CheckpointFunction::apply(c10::IValue::make_capsule(state), at::TensorList(all));
}

}  // namespace tdist::fsdp::detail

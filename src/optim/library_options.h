#pragma once

// What Adam, AdamW and SGD share about living on LibTorch's optimizers: this library's
// options (LibTorch's plus maximize and the implementation) in place of the sliced copies
// LibTorch's constructors store, reading those two fields from any group, resolving a group's
// implementation, and the closure prologue of step().

#include <memory>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>

#include "optim/tensor_buckets.h"
#include "tdist/error.h"
#include "tdist/optim/implementation.h"

namespace tdist::optim::detail {

/// The two fields this library adds to LibTorch's options.
struct Extension {
  bool maximize = false;
  Implementation implementation = Implementation::kDefault;
};

/// A group's extension: its own when its options are `Options`, else the defaults' (a group
/// added with LibTorch's options, or read back from a torch::load archive).
template <class Options>
Extension extension_of(const torch::optim::OptimizerOptions& group_options,
                       const torch::optim::OptimizerOptions& defaults) {
  const auto* ours = dynamic_cast<const Options*>(&group_options);
  if (ours == nullptr) ours = dynamic_cast<const Options*>(&defaults);
  if (ours == nullptr) return {};
  return {ours->maximize(), ours->implementation()};
}

/// Makes the defaults, and every group's options, `Options` (LibTorch's base constructor
/// stored them sliced), keeping each group's own LibTorch values.
template <class Options>
void adopt_options(std::unique_ptr<torch::optim::OptimizerOptions>& defaults_slot,
                   std::vector<torch::optim::OptimizerParamGroup>& groups,
                   const Options& defaults) {
  defaults_slot = std::make_unique<Options>(defaults);
  for (auto& group : groups) {
    if (dynamic_cast<const Options*>(&group.options()) != nullptr) continue;
    Options ours(static_cast<const typename Options::Base&>(group.options()));
    ours.maximize(defaults.maximize()).implementation(defaults.implementation());
    group.set_options(std::make_unique<Options>(ours));
  }
}

/// The implementation group `group` runs: its own, or kDefault resolved on its parameters.
template <class Options>
Implementation implementation_of(const torch::optim::Optimizer& opt, size_t group,
                                 const char* name) {
  TDIST_CHECK_ARG(group < opt.param_groups().size(),
                  std::string("tdist::optim::") + name + "::implementation: param group " +
                      std::to_string(group) + " does not exist (the optimizer has " +
                      std::to_string(opt.param_groups().size()) + ")");
  const auto& g = opt.param_groups()[group];
  const Implementation chosen = extension_of<Options>(g.options(), opt.defaults()).implementation;
  if (chosen != Implementation::kDefault) return chosen;
  SteppedParams all;
  all.params = g.params();
  return resolve(chosen, all, group, name);
}

/// step()'s prologue: the closure's loss, computed with gradients enabled (undefined without
/// a closure).
inline at::Tensor evaluate_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace tdist::optim::detail

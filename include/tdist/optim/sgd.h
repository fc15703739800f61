#pragma once

// SGD with PyTorch's three implementations (for-loop, foreach, fused).
//
//   tdist::optim::SGD opt(model->parameters(), tdist::optim::SGDOptions(0.1).momentum(0.9)
//                                                  .nesterov(true));
//
// It is LibTorch's torch::optim::SGD (same param groups and SGDParamState) with a step() that
// adds `maximize` and runs the implementation chosen; see adam.h for how LibTorch-typed
// group options are read.

#include <memory>
#include <vector>

#include <torch/optim/sgd.h>

#include "tdist/optim/implementation.h"

namespace tdist::optim {

/// torch::optim::SGDOptions plus `maximize` and the implementation; every setter chains.
class SGDOptions : public torch::optim::SGDOptions {
 public:
  using Base = torch::optim::SGDOptions;
  explicit SGDOptions(double lr) : Base(lr) {}
  /// LibTorch's options, with maximize off and the default implementation.
  SGDOptions(const Base& base) : Base(base) {}  // NOLINT(google-explicit-constructor)

  SGDOptions& lr(double v) {
    Base::lr(v);
    return *this;
  }
  double lr() const { return Base::lr(); }
  SGDOptions& momentum(double v) {
    Base::momentum(v);
    return *this;
  }
  double momentum() const { return Base::momentum(); }
  SGDOptions& dampening(double v) {
    Base::dampening(v);
    return *this;
  }
  double dampening() const { return Base::dampening(); }
  SGDOptions& weight_decay(double v) {
    Base::weight_decay(v);
    return *this;
  }
  double weight_decay() const { return Base::weight_decay(); }
  SGDOptions& nesterov(bool v) {
    Base::nesterov(v);
    return *this;
  }
  bool nesterov() const { return Base::nesterov(); }
  /// Ascend the objective instead of descending it.
  SGDOptions& maximize(bool v) {
    maximize_ = v;
    return *this;
  }
  bool maximize() const { return maximize_; }
  SGDOptions& implementation(Implementation v) {
    implementation_ = v;
    return *this;
  }
  Implementation implementation() const { return implementation_; }

  std::unique_ptr<torch::optim::OptimizerOptions> clone() const override {
    return std::make_unique<SGDOptions>(*this);
  }

 private:
  bool maximize_ = false;
  Implementation implementation_ = Implementation::kDefault;
};

/// SGD with momentum, dampening, Nesterov momentum and weight decay, as torch.optim.SGD.
class SGD : public torch::optim::SGD {
 public:
  explicit SGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
               SGDOptions defaults);
  explicit SGD(std::vector<at::Tensor> params, SGDOptions defaults);

  at::Tensor step(LossClosure closure = nullptr) override;
  /// The implementation step() runs for param group `group` (kDefault resolved).
  Implementation implementation(size_t group = 0) const;
};

}  // namespace tdist::optim

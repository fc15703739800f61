#pragma once

// Adam and AdamW with PyTorch's three implementations (for-loop, foreach, fused).
//
//   namespace optim = tdist::optim;
//   optim::AdamW opt(model->parameters(),
//                    optim::AdamWOptions(3e-4).weight_decay(0.1).implementation(
//                        optim::Implementation::kFused));
//
// They are LibTorch's torch::optim::Adam / AdamW (same param groups, the same per-parameter
// state, AdamParamState / AdamWParamState, so LR schedulers, serialization, the FSDP and
// DCP optimizer state dicts and ZeroRedundancyOptimizer take them unchanged) with a step()
// that adds `maximize` and runs the implementation chosen. A param group whose options are
// LibTorch's AdamOptions / AdamWOptions (a group added with them, or a loaded archive) takes
// `maximize` and `implementation` from the optimizer's defaults.

#include <memory>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "tdist/optim/implementation.h"

namespace tdist::optim {

/// LibTorch's AdamOptions or AdamWOptions plus PyTorch's `maximize` and the implementation;
/// every setter chains. Use AdamOptions / AdamWOptions (AdamW's weight decay defaults to 1e-2,
/// as PyTorch's).
template <class LibTorchOptions>
class AdamFamilyOptions : public LibTorchOptions {
 public:
  using Base = LibTorchOptions;
  using betas_t = std::tuple<double, double>;
  explicit AdamFamilyOptions(double lr = 1e-3) : Base(lr) {}
  /// LibTorch's options, with maximize off and the default implementation.
  AdamFamilyOptions(const Base& base) : Base(base) {}  // NOLINT(google-explicit-constructor)

  AdamFamilyOptions& lr(double v) {
    Base::lr(v);
    return *this;
  }
  double lr() const { return Base::lr(); }
  AdamFamilyOptions& betas(const betas_t& v) {
    Base::betas(v);
    return *this;
  }
  const betas_t& betas() const { return Base::betas(); }
  AdamFamilyOptions& eps(double v) {
    Base::eps(v);
    return *this;
  }
  double eps() const { return Base::eps(); }
  AdamFamilyOptions& weight_decay(double v) {
    Base::weight_decay(v);
    return *this;
  }
  double weight_decay() const { return Base::weight_decay(); }
  AdamFamilyOptions& amsgrad(bool v) {
    Base::amsgrad(v);
    return *this;
  }
  bool amsgrad() const { return Base::amsgrad(); }
  /// Ascend the objective instead of descending it.
  AdamFamilyOptions& maximize(bool v) {
    maximize_ = v;
    return *this;
  }
  bool maximize() const { return maximize_; }
  AdamFamilyOptions& implementation(Implementation v) {
    implementation_ = v;
    return *this;
  }
  Implementation implementation() const { return implementation_; }

  std::unique_ptr<torch::optim::OptimizerOptions> clone() const override {
    return std::make_unique<AdamFamilyOptions>(*this);
  }

 private:
  bool maximize_ = false;
  Implementation implementation_ = Implementation::kDefault;
};

using AdamOptions = AdamFamilyOptions<torch::optim::AdamOptions>;
using AdamWOptions = AdamFamilyOptions<torch::optim::AdamWOptions>;

namespace detail {
/// The fused kernels read each parameter's step from a float tensor on its device; these
/// mirror the int64 steps of the LibTorch state, so the state dict keeps its layout.
class StepTensors {
 public:
  /// The step tensor of `param`, holding `step` (refilled when it does not); the caller adds
  /// one to it before the kernel reads it, so step + 1 is what it then holds.
  const at::Tensor& of(const at::Tensor& param, int64_t step);

 private:
  struct Mirror {
    at::Tensor value;
    int64_t step = 0;
  };
  std::unordered_map<void*, Mirror> mirrors_;
};
}  // namespace detail

/// Adam (L2 weight decay added to the gradient), as torch.optim.Adam.
class Adam : public torch::optim::Adam {
 public:
  explicit Adam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                AdamOptions defaults = AdamOptions());
  explicit Adam(std::vector<at::Tensor> params, AdamOptions defaults = AdamOptions());

  at::Tensor step(LossClosure closure = nullptr) override;
  /// The implementation step() runs for param group `group` (kDefault resolved).
  Implementation implementation(size_t group = 0) const;

 private:
  detail::StepTensors steps_;
};

/// AdamW (decoupled weight decay), as torch.optim.AdamW.
class AdamW : public torch::optim::AdamW {
 public:
  explicit AdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                 AdamWOptions defaults = AdamWOptions());
  explicit AdamW(std::vector<at::Tensor> params, AdamWOptions defaults = AdamWOptions());

  at::Tensor step(LossClosure closure = nullptr) override;
  /// The implementation step() runs for param group `group` (kDefault resolved).
  Implementation implementation(size_t group = 0) const;

 private:
  detail::StepTensors steps_;
};

}  // namespace tdist::optim

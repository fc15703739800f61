#include "tdist/optim/adam.h"

#include <cmath>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "optim/library_options.h"
#include "optim/tensor_buckets.h"
#include "tdist/error.h"

namespace tdist::optim {
namespace detail {

const at::Tensor& StepTensors::of(const at::Tensor& param, int64_t step) {
  Mirror& m = mirrors_[param.unsafeGetTensorImpl()];
  if (!m.value.defined() || m.value.device() != param.device()) {
    m.value = at::full({}, static_cast<double>(step), param.options().dtype(at::kFloat));
  } else if (m.step != step) {
    m.value.fill_(static_cast<double>(step));  // a loaded state, or a step by another path
  }
  m.step = step + 1;
  return m.value;
}

}  // namespace detail

namespace {

// One param group's hyperparameters, whichever options type the group holds.
struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, maximize;
  Implementation implementation;
};

template <class Options>
AdamHyper hyper_of(const torch::optim::OptimizerOptions& group_options,
                   const torch::optim::OptimizerOptions& defaults) {
  const auto& base = static_cast<const typename Options::Base&>(group_options);
  const detail::Extension ext = detail::extension_of<Options>(group_options, defaults);
  return {base.lr(),    std::get<0>(base.betas()), std::get<1>(base.betas()),
          base.eps(),   base.weight_decay(),       base.amsgrad(),
          ext.maximize, ext.implementation};
}

// The per-parameter state, created as LibTorch creates it on a parameter's first step.
template <class State>
State& state_of(torch::optim::Optimizer& opt, const at::Tensor& p, bool amsgrad) {
  auto& slot = opt.state()[p.unsafeGetTensorImpl()];
  if (!slot) {
    auto fresh = std::make_unique<State>();
    fresh->step(0);
    fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    if (amsgrad) fresh->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    slot = std::move(fresh);
  }
  auto& st = static_cast<State&>(*slot);
  if (amsgrad && !st.max_exp_avg_sq().defined()) {
    st.max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
  }
  return st;
}

// LibTorch's torch::optim::Adam(W) step, op for op, plus `maximize`.
template <class State>
void for_loop(torch::optim::Optimizer& opt, const detail::SteppedParams& s, const AdamHyper& h,
              bool decoupled) {
  for (size_t i = 0; i < s.params.size(); ++i) {
    at::Tensor p = s.params[i];
    at::Tensor grad = h.maximize ? -s.grads[i] : s.grads[i];
    State& st = state_of<State>(opt, p, h.amsgrad);
    st.step(st.step() + 1);
    const double bc1 = 1 - std::pow(h.beta1, st.step());
    const double bc2 = 1 - std::pow(h.beta2, st.step());
    if (h.weight_decay != 0) {
      if (decoupled) {
        p.mul_(1 - h.lr * h.weight_decay);
      } else {
        grad = grad.add(p, h.weight_decay);
      }
    }
    st.exp_avg().mul_(h.beta1).add_(grad, 1 - h.beta1);
    st.exp_avg_sq().mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
    at::Tensor denom;
    if (h.amsgrad) {
      at::maximum_out(st.max_exp_avg_sq(), st.max_exp_avg_sq(), st.exp_avg_sq());
      denom = (st.max_exp_avg_sq().sqrt() / std::sqrt(bc2)).add_(h.eps);
    } else {
      denom = (st.exp_avg_sq().sqrt() / std::sqrt(bc2)).add_(h.eps);
    }
    p.addcdiv_(st.exp_avg(), denom, -h.lr / bc1);
  }
}

// torch.optim's _multi_tensor_adam (the non-capturable path), per (device, dtype) bucket.
template <class State>
void foreach_bucket(torch::optim::Optimizer& opt, std::vector<at::Tensor> params,
                    std::vector<at::Tensor> grads, const AdamHyper& h, bool decoupled) {
  std::vector<at::Tensor> exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<at::Scalar> step_size, bc2_sqrt;
  for (const auto& p : params) {
    State& st = state_of<State>(opt, p, h.amsgrad);
    st.step(st.step() + 1);
    exp_avgs.push_back(st.exp_avg());
    exp_avg_sqs.push_back(st.exp_avg_sq());
    if (h.amsgrad) max_exp_avg_sqs.push_back(st.max_exp_avg_sq());
    const double bc1 = 1 - std::pow(h.beta1, st.step());
    step_size.emplace_back(-h.lr / bc1);
    bc2_sqrt.emplace_back(std::sqrt(1 - std::pow(h.beta2, st.step())));
  }
  if (h.maximize) grads = at::_foreach_neg(grads);
  if (h.weight_decay != 0) {
    if (decoupled) {
      at::_foreach_mul_(params, 1 - h.lr * h.weight_decay);
    } else {
      grads = at::_foreach_add(grads, params, h.weight_decay);
    }
  }
  at::_foreach_lerp_(exp_avgs, grads, 1 - h.beta1);
  at::_foreach_mul_(exp_avg_sqs, h.beta2);
  at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - h.beta2);
  std::vector<at::Tensor> denom;
  if (h.amsgrad) {
    at::_foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs);
    denom = at::_foreach_sqrt(max_exp_avg_sqs);
  } else {
    denom = at::_foreach_sqrt(exp_avg_sqs);
  }
  at::_foreach_div_(denom, bc2_sqrt);
  at::_foreach_add_(denom, h.eps);
  at::_foreach_addcdiv_(params, exp_avgs, denom, step_size);
}

// ATen's fused kernel, one call per (device, dtype) bucket.
template <class State>
void fused_bucket(torch::optim::Optimizer& opt, detail::StepTensors& steps,
                  std::vector<at::Tensor> params, std::vector<at::Tensor> grads, const AdamHyper& h,
                  bool decoupled) {
  std::vector<at::Tensor> exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    State& st = state_of<State>(opt, p, h.amsgrad);
    // Note [Fused kernels and strides]; the state keeps the re-laid tensors.
    grads[i] = detail::laid_out_like(p, grads[i]);
    st.exp_avg(detail::laid_out_like(p, st.exp_avg()));
    st.exp_avg_sq(detail::laid_out_like(p, st.exp_avg_sq()));
    if (h.amsgrad) st.max_exp_avg_sq(detail::laid_out_like(p, st.max_exp_avg_sq()));
    exp_avgs.push_back(st.exp_avg());
    exp_avg_sqs.push_back(st.exp_avg_sq());
    if (h.amsgrad) max_exp_avg_sqs.push_back(st.max_exp_avg_sq());
    state_steps.push_back(steps.of(p, st.step()));
    st.step(st.step() + 1);
  }
  at::_foreach_add_(state_steps, 1);  // the kernel reads the new step, as torch.optim's
  if (decoupled) {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, h.lr,
                      h.beta1, h.beta2, h.weight_decay, h.eps, h.amsgrad, h.maximize);
  } else {
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, h.lr,
                     h.beta1, h.beta2, h.weight_decay, h.eps, h.amsgrad, h.maximize);
  }
}

template <class State, class Options>
at::Tensor adam_step(torch::optim::Optimizer& opt, detail::StepTensors& steps,
                     const torch::optim::Optimizer::LossClosure& closure, bool decoupled,
                     const char* name) {
  const at::Tensor loss = detail::evaluate_closure(closure);
  at::NoGradGuard no_grad;
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    auto& group = opt.param_groups()[g];
    const AdamHyper h = hyper_of<Options>(group.options(), opt.defaults());
    const detail::SteppedParams s = detail::stepped_params(group.params(), g, name);
    if (s.params.empty()) continue;
    switch (detail::resolve(h.implementation, s, g, name)) {
      case Implementation::kForeach:
        for (const auto& b : detail::by_device_and_dtype(s.params)) {
          foreach_bucket<State>(opt, detail::pick(s.params, b), detail::pick(s.grads, b), h,
                                decoupled);
        }
        break;
      case Implementation::kFused:
        for (const auto& b : detail::by_device_and_dtype(s.params)) {
          fused_bucket<State>(opt, steps, detail::pick(s.params, b), detail::pick(s.grads, b), h,
                              decoupled);
        }
        break;
      default:
        for_loop<State>(opt, s, h, decoupled);
    }
  }
  return loss;
}

}  // namespace

Adam::Adam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, AdamOptions defaults)
    : torch::optim::Adam(param_groups, defaults) {
  detail::adopt_options(defaults_, param_groups_, defaults);
}

Adam::Adam(std::vector<at::Tensor> params, AdamOptions defaults)
    : Adam({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

at::Tensor Adam::step(LossClosure closure) {
  return adam_step<torch::optim::AdamParamState, AdamOptions>(*this, steps_, closure,
                                                              /*decoupled=*/false, "Adam");
}

Implementation Adam::implementation(size_t group) const {
  return detail::implementation_of<AdamOptions>(*this, group, "Adam");
}

AdamW::AdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
             AdamWOptions defaults)
    : torch::optim::AdamW(param_groups, defaults) {
  detail::adopt_options(defaults_, param_groups_, defaults);
}

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions defaults)
    : AdamW({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

at::Tensor AdamW::step(LossClosure closure) {
  return adam_step<torch::optim::AdamWParamState, AdamWOptions>(*this, steps_, closure,
                                                                /*decoupled=*/true, "AdamW");
}

Implementation AdamW::implementation(size_t group) const {
  return detail::implementation_of<AdamWOptions>(*this, group, "AdamW");
}

}  // namespace tdist::optim

#include "tdist/optim/sgd.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "optim/library_options.h"
#include "optim/tensor_buckets.h"
#include "tdist/error.h"

namespace tdist::optim {
namespace {

constexpr const char* kName = "SGD";

struct SGDHyper {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, maximize;
  Implementation implementation;
};

SGDHyper hyper_of(const torch::optim::OptimizerOptions& group_options,
                  const torch::optim::OptimizerOptions& defaults) {
  const auto& base = static_cast<const torch::optim::SGDOptions&>(group_options);
  const detail::Extension ext = detail::extension_of<SGDOptions>(group_options, defaults);
  return {base.lr(),       base.momentum(), base.dampening(),  base.weight_decay(),
          base.nesterov(), ext.maximize,    ext.implementation};
}

torch::optim::SGDParamState& state_of(torch::optim::Optimizer& opt, const at::Tensor& p) {
  auto& slot = opt.state()[p.unsafeGetTensorImpl()];
  if (!slot) slot = std::make_unique<torch::optim::SGDParamState>();
  return static_cast<torch::optim::SGDParamState&>(*slot);
}

// LibTorch's torch::optim::SGD step, op for op, plus `maximize`.
void for_loop(torch::optim::Optimizer& opt, const detail::SteppedParams& s, const SGDHyper& h) {
  for (size_t i = 0; i < s.params.size(); ++i) {
    at::Tensor p = s.params[i];
    at::Tensor d_p = h.maximize ? -s.grads[i] : s.grads[i];
    if (h.weight_decay != 0) d_p = d_p.add(p, h.weight_decay);
    if (h.momentum != 0) {
      auto& st = state_of(opt, p);
      at::Tensor buf = st.momentum_buffer();
      if (!buf.defined()) {
        buf = d_p.clone().detach();
        st.momentum_buffer(buf);
      } else {
        buf.mul_(h.momentum).add_(d_p, 1 - h.dampening);
      }
      d_p = h.nesterov ? d_p.add(buf, h.momentum) : buf;
    }
    p.add_(d_p, -h.lr);
  }
}

// torch.optim's _multi_tensor_sgd, per (device, dtype) bucket.
void foreach_bucket(torch::optim::Optimizer& opt, std::vector<at::Tensor> params,
                    std::vector<at::Tensor> grads, const SGDHyper& h) {
  if (h.maximize) grads = at::_foreach_neg(grads);
  if (h.weight_decay != 0) grads = at::_foreach_add(grads, params, h.weight_decay);
  if (h.momentum != 0) {
    std::vector<at::Tensor> bufs;
    bool all_present = true;
    for (const auto& p : params) {
      bufs.push_back(state_of(opt, p).momentum_buffer());
      all_present = all_present && bufs.back().defined();
    }
    if (all_present) {
      at::_foreach_mul_(bufs, h.momentum);
      at::_foreach_add_(bufs, grads, 1 - h.dampening);
    } else {
      for (size_t i = 0; i < params.size(); ++i) {
        if (!bufs[i].defined()) {
          bufs[i] = grads[i].clone().detach();
          state_of(opt, params[i]).momentum_buffer(bufs[i]);
        } else {
          bufs[i].mul_(h.momentum).add_(grads[i], 1 - h.dampening);
        }
      }
    }
    if (h.nesterov) {
      grads = at::_foreach_add(grads, bufs, h.momentum);
    } else {
      grads = bufs;
    }
  }
  at::_foreach_add_(params, grads, -h.lr);
}

// ATen's fused kernel. Parameters whose momentum buffer does not exist yet go in a call of
// their own with is_first_step (the kernel then fills the buffer), as torch.optim's
// _fused_sgd does for a first step.
void fused_bucket(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params,
                  std::vector<at::Tensor> grads, const SGDHyper& h) {
  // Note [Fused kernels and strides].
  for (size_t i = 0; i < params.size(); ++i) grads[i] = detail::laid_out_like(params[i], grads[i]);
  if (h.momentum == 0) {
    at::_fused_sgd_(params, grads, {}, h.weight_decay, h.momentum, h.lr, h.dampening, h.nesterov,
                    h.maximize, /*is_first_step=*/false);
    return;
  }
  std::vector<at::Tensor> p_old, g_old, b_old, p_new, g_new, b_new;
  for (size_t i = 0; i < params.size(); ++i) {
    auto& st = state_of(opt, params[i]);
    if (st.momentum_buffer().defined()) {
      st.momentum_buffer(detail::laid_out_like(params[i], st.momentum_buffer()));
      p_old.push_back(params[i]), g_old.push_back(grads[i]);
      b_old.push_back(st.momentum_buffer());
    } else {
      st.momentum_buffer(at::empty_like(grads[i], at::MemoryFormat::Preserve));
      p_new.push_back(params[i]), g_new.push_back(grads[i]);
      b_new.push_back(st.momentum_buffer());
    }
  }
  if (!p_old.empty()) {
    at::_fused_sgd_(p_old, g_old, b_old, h.weight_decay, h.momentum, h.lr, h.dampening, h.nesterov,
                    h.maximize, /*is_first_step=*/false);
  }
  if (!p_new.empty()) {
    at::_fused_sgd_(p_new, g_new, b_new, h.weight_decay, h.momentum, h.lr, h.dampening, h.nesterov,
                    h.maximize, /*is_first_step=*/true);
  }
}

}  // namespace

SGD::SGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, SGDOptions defaults)
    : torch::optim::SGD(param_groups, defaults) {
  detail::adopt_options(defaults_, param_groups_, defaults);
}

SGD::SGD(std::vector<at::Tensor> params, SGDOptions defaults)
    : SGD({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

at::Tensor SGD::step(LossClosure closure) {
  const at::Tensor loss = detail::evaluate_closure(closure);
  at::NoGradGuard no_grad;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const SGDHyper h = hyper_of(param_groups_[g].options(), *defaults_);
    const detail::SteppedParams s = detail::stepped_params(param_groups_[g].params(), g, kName);
    if (s.params.empty()) continue;
    switch (detail::resolve(h.implementation, s, g, kName)) {
      case Implementation::kForeach:
        for (const auto& b : detail::by_device_and_dtype(s.params)) {
          foreach_bucket(*this, detail::pick(s.params, b), detail::pick(s.grads, b), h);
        }
        break;
      case Implementation::kFused:
        for (const auto& b : detail::by_device_and_dtype(s.params)) {
          fused_bucket(*this, detail::pick(s.params, b), detail::pick(s.grads, b), h);
        }
        break;
      default:
        for_loop(*this, s, h);
    }
  }
  return loss;
}

Implementation SGD::implementation(size_t group) const {
  return detail::implementation_of<SGDOptions>(*this, group, kName);
}

}  // namespace tdist::optim

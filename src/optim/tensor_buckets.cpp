#include "optim/tensor_buckets.h"

#include <iterator>
#include <utility>

#include <ATen/ATen.h>

#include "tdist/error.h"

namespace tdist::optim::detail {
namespace {

std::string where(const char* optimizer, size_t group, size_t position) {
  return std::string("tdist::optim::") + optimizer + ": parameter " + std::to_string(position) +
         " of param group " + std::to_string(group);
}

bool fused_device(const at::Tensor& t) {
  return t.is_cpu() || t.is_cuda();
}

}  // namespace

SteppedParams stepped_params(const std::vector<at::Tensor>& group, size_t group_index,
                             const char* optimizer) {
  SteppedParams out;
  for (size_t i = 0; i < group.size(); ++i) {
    const at::Tensor& p = group[i];
    if (!p.grad().defined()) continue;
    TDIST_CHECK_ARG(!p.grad().is_sparse(),
                    where(optimizer, group_index, i) +
                        " has a sparse gradient, which this optimizer does not support "
                        "(densify it first: grad.to_dense())");
    out.params.push_back(p);
    out.grads.push_back(p.grad());
    out.positions.push_back(i);
  }
  return out;
}

Implementation resolve(Implementation requested, const SteppedParams& stepped, size_t group_index,
                       const char* optimizer) {
  if (requested == Implementation::kDefault) {
    bool all_cuda = !stepped.params.empty();
    for (const auto& p : stepped.params) all_cuda = all_cuda && p.is_cuda();
    return all_cuda ? Implementation::kForeach : Implementation::kForLoop;
  }
  for (size_t k = 0; k < stepped.params.size(); ++k) {
    const at::Tensor& p = stepped.params[k];
    const std::string name = where(optimizer, group_index, stepped.positions[k]);
    if (requested != Implementation::kForLoop) {
      TDIST_CHECK_ARG(p.layout() == at::kStrided,
                      name + " is not a strided tensor; the " + to_string(requested) +
                          " implementation takes strided tensors only (use for-loop)");
    }
    if (requested == Implementation::kFused) {
      TDIST_CHECK_ARG(
          at::isFloatingType(p.scalar_type()) && fused_device(p),
          name + " is " + std::string(c10::toString(p.scalar_type())) + " on " + p.device().str() +
              "; ATen's fused kernels take floating-point parameters on CPU or CUDA (use "
              "Implementation::kForeach or kForLoop)");
      TDIST_CHECK_ARG(p.is_non_overlapping_and_dense(),
                      name +
                          " is not dense (its elements overlap or leave gaps); the fused kernel "
                          "walks it as memory (use Implementation::kForeach or kForLoop)");
      TDIST_CHECK_ARG(stepped.grads[k].device() == p.device() &&
                          stepped.grads[k].scalar_type() == p.scalar_type(),
                      name +
                          "'s gradient differs from it in device or dtype; the fused "
                          "kernel needs both equal");
    }
  }
  return requested;
}

at::Tensor laid_out_like(const at::Tensor& param, const at::Tensor& t) {
  if (!t.defined() || t.strides() == param.strides()) return t;
  at::Tensor out = at::empty_like(param, at::MemoryFormat::Preserve);
  out.copy_(t);
  return out;
}

std::vector<std::vector<size_t>> by_device_and_dtype(const std::vector<at::Tensor>& params) {
  std::vector<std::pair<std::pair<at::Device, at::ScalarType>, std::vector<size_t>>> buckets;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto key = std::make_pair(params[i].device(), params[i].scalar_type());
    auto it = buckets.begin();
    while (it != buckets.end() && it->first != key) ++it;
    if (it == buckets.end()) {
      buckets.push_back({key, {}});
      it = std::prev(buckets.end());
    }
    it->second.push_back(i);
  }
  std::vector<std::vector<size_t>> out;
  for (auto& b : buckets) out.push_back(std::move(b.second));
  return out;
}

std::vector<at::Tensor> pick(const std::vector<at::Tensor>& all,
                             const std::vector<size_t>& indices) {
  std::vector<at::Tensor> out;
  out.reserve(indices.size());
  for (size_t i : indices) out.push_back(all[i]);
  return out;
}

}  // namespace tdist::optim::detail

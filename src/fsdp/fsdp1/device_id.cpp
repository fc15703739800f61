#include "fsdp/fsdp1/device_id.h"

#include <functional>
#include <vector>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include "tdist/error.h"
#include "tdist/fsdp/fully_shard.h"

namespace tdist::fsdp::detail {

namespace {

/// device_id with its index: PyTorch takes the current device for "cuda" without one.
c10::Device resolve(const c10::Device& device, const std::string& at) {
  const std::string given = "device_id " + device.str();
  if (device.is_cpu()) return device;
  if (!device.is_cuda()) {
    TDIST_THROW(InvalidArgument, at + given +
                                     " is not supported; pass a CUDA device "
                                     "(device_id(LOCAL_RANK)) or torch::kCPU");
  }
  if (!torch::cuda::is_available()) {
    TDIST_THROW(InvalidArgument,
                at + given +
                    ", but this process sees no CUDA device (a LibTorch without CUDA, no GPU, "
                    "or CUDA_VISIBLE_DEVICES empty); leave device_id unset or pass torch::kCPU "
                    "to train on the CPU, or run where a GPU is visible");
  }
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  const c10::DeviceIndex index =
      device.has_index()
          ? device.index()
          : c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index();
  if (index < 0 || index >= count) {
    TDIST_THROW(InvalidArgument, at + given + ", but this process sees " + std::to_string(count) +
                                     " CUDA device(s); pass an index below " +
                                     std::to_string(count) + " (usually LOCAL_RANK)");
  }
  return c10::Device(c10::DeviceType::CUDA, index);
}

struct Placed {
  std::string name;
  at::Tensor tensor;
  bool is_parameter;
};

/// The module's parameters and buffers FSDP1 places, as PyTorch's walk that stops at nested
/// FSDP modules (here: fully_shard'ed ones).
std::vector<Placed> placed_tensors(
    torch::nn::Module& root, const std::unordered_set<const torch::nn::Module*>& ignored_modules,
    const std::unordered_set<const c10::TensorImpl*>& ignored_params) {
  std::vector<Placed> out;
  std::function<void(torch::nn::Module&, const std::string&)> visit =
      [&](torch::nn::Module& m, const std::string& prefix) {
        for (const auto& p : m.named_parameters(/*recurse=*/false)) {
          if (ignored_params.count(p.value().unsafeGetTensorImpl()) == 0) {
            out.push_back({prefix + p.key(), p.value(), true});
          }
        }
        for (const auto& b : m.named_buffers(/*recurse=*/false)) {
          out.push_back({prefix + b.key(), b.value(), false});
        }
        for (const auto& child : m.named_children()) {
          if (ignored_modules.count(child.value().get()) != 0) continue;
          if (is_fully_sharded(*child.value())) continue;
          visit(*child.value(), prefix + child.key() + ".");
        }
      };
  visit(root, "");
  return out;
}

}  // namespace

c10::Device place_on_device(torch::nn::Module& root, const std::optional<c10::Device>& device_id,
                            const std::unordered_set<const torch::nn::Module*>& ignored_modules,
                            const std::unordered_set<const c10::TensorImpl*>& ignored_params,
                            const std::string& at) {
  const auto tensors = placed_tensors(root, ignored_modules, ignored_params);
  if (!device_id) {
    for (const Placed& p : tensors) {
      if (p.is_parameter) return p.tensor.device();
    }
    return c10::Device(c10::DeviceType::CPU);
  }
  const c10::Device device = resolve(*device_id, at);
  for (const Placed& p : tensors) {
    // Meta tensors wait for materialize, which allocates them on the device it is given.
    if (!p.tensor.device().is_cpu() && !p.tensor.is_meta() && p.tensor.device() != device) {
      TDIST_THROW(InvalidArgument, at + "'" + p.name + "' is on " + p.tensor.device().str() +
                                       ", not on device_id " + device.str() +
                                       " (PyTorch: inconsistent compute device and device_id); "
                                       "build the module on the CPU or on device_id");
    }
  }
  if (device.is_cpu()) return device;
  torch::NoGradGuard no_grad;
  for (const Placed& p : tensors) {
    if (!p.tensor.device().is_cpu()) continue;
    // As nn.Module._apply's .data path: the same variables (the optimizer built later and any
    // alias keep them), their data on the device.
    if (p.tensor.grad().defined()) p.tensor.grad().set_data(p.tensor.grad().to(device));
    p.tensor.set_data(p.tensor.to(device));
  }
  return device;
}

}  // namespace tdist::fsdp::detail

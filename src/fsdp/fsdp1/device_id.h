#pragma once

// FSDP1's device_id: the device a module is moved to before sharding, as PyTorch's
// _get_device_from_device_id and _move_module_to_device.

#include <optional>
#include <string>
#include <unordered_set>

#include <c10/core/Device.h>
#include <torch/nn/module.h>

namespace tdist::fsdp::detail {

/// Moves the parameters and buffers of `root` that are on the CPU to `device_id` (not those
/// of ignored modules, ignored parameters, or modules fully_shard'ed already) and returns the
/// compute device. A CUDA device_id is checked first (a CUDA build that sees the device), and
/// a tensor already on a device other than the CPU and device_id is an error, all raised as
/// InvalidArgument starting with `at` before anything moves. Without device_id nothing moves:
/// the compute device is that of the first parameter left to shard (the CPU if none).
c10::Device place_on_device(torch::nn::Module& root, const std::optional<c10::Device>& device_id,
                            const std::unordered_set<const torch::nn::Module*>& ignored_modules,
                            const std::unordered_set<const c10::TensorImpl*>& ignored_params,
                            const std::string& at);

}  // namespace tdist::fsdp::detail

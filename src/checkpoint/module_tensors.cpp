#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "checkpoint/dtype.h"
#include "tdist/checkpoint/checkpoint.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/error.h"

namespace tdist::checkpoint {

TensorMap module_tensors(const torch::nn::Module& module) {
  TensorMap out;
  for (const auto& item : module.named_parameters(true)) {
    out[item.key()] = item.value().detach().to(at::kCPU).contiguous();
  }
  for (const auto& item : module.named_buffers(true)) {
    out[item.key()] = item.value().detach().to(at::kCPU).contiguous();
  }
  return out;
}

void load_module_tensors(torch::nn::Module& module, const TensorMap& tensors, bool strict) {
  std::map<std::string, at::Tensor> targets;
  for (const auto& item : module.named_parameters(true)) targets[item.key()] = item.value();
  for (const auto& item : module.named_buffers(true)) targets[item.key()] = item.value();
  std::string missing, unexpected, mismatched;
  auto add = [](std::string& list, const std::string& s) {
    list += (list.empty() ? "" : ", ") + s;
  };
  for (const auto& [name, t] : targets) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      add(missing, name);
    } else if (it->second.sizes() != t.sizes()) {
      add(mismatched, name);
    }
  }
  for (const auto& [name, t] : tensors) {
    if (targets.count(name) == 0) add(unexpected, name);
  }
  if (strict && (!missing.empty() || !unexpected.empty() || !mismatched.empty())) {
    TDIST_THROW(CheckpointError,
                "load_module_tensors: state does not match the module. missing: [" + missing +
                    "] unexpected: [" + unexpected + "] shape mismatch: [" + mismatched +
                    "]; pass strict=false to load what matches");
  }
  c10::AutoGradMode no_grad(false);
  for (const auto& [name, t] : targets) {
    auto it = tensors.find(name);
    if (it != tensors.end() && it->second.sizes() == t.sizes()) t.copy_(it->second);
  }
}

TensorMap read_full_tensors(const std::string& dir, const std::string& prefix) {
  const CheckpointMetadata metadata = read_metadata(dir);
  ShardedStateDict state;
  for (const auto& [name, info] : metadata.tensors) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const auto dtype = detail::dtype_from_name(info.dtype, "'" + name + "' in '" + dir + "'");
    state[name] =
        ShardedTensor::whole(at::empty(info.global_shape, at::TensorOptions().dtype(dtype)));
  }
  LoadOptions options;
  options.coordinator(std::make_shared<LocalCoordinator>());
  load(state, dir, options);
  TensorMap out;
  for (auto& [name, st] : state) out[name.substr(prefix.size())] = st.local;
  return out;
}

}  // namespace tdist::checkpoint

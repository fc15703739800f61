#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "checkpoint/dtype.h"
#include "tdist/checkpoint/checkpoint.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/error.h"
#include "tdist/fsdp/state_dict.h"

namespace tdist::checkpoint {

TensorMap module_tensors(const torch::nn::Module& module) {
  // Whole tensors on every rank: gathered for an FSDP module (collective then), copies
  // otherwise. Not cpu_offload: that returns them on rank 0 only.
  TensorMap out;
  const auto full =
      fsdp::get_model_state_dict(module, fsdp::StateDictOptions().full_state_dict(true));
  for (const auto& [name, st] : full) out[name] = st.local.cpu().contiguous();
  return out;
}

void load_module_tensors(torch::nn::Module& module, const TensorMap& tensors, bool strict) {
  // Global shapes of every parameter and buffer (sharded or not), without communication.
  const ShardedStateDict targets = fsdp::get_model_state_dict(module);
  std::string missing, unexpected, mismatched;
  auto add = [](std::string& list, const std::string& s) {
    list += (list.empty() ? "" : ", ") + s;
  };
  ShardedStateDict matching;
  for (const auto& [name, t] : targets) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      add(missing, name);
    } else if (it->second.sizes().vec() != t.global_shape) {
      add(mismatched, name);
    } else {
      matching[name] = ShardedTensor::whole(it->second);
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
  fsdp::set_model_state_dict(module, matching,
                             fsdp::StateDictOptions().full_state_dict(true).strict(false));
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

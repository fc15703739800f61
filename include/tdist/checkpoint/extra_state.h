#pragma once

// The small typed training state saved beside the tensors: step, RNG states, data position
// and anything else as JSON. Each rank's ExtraState is saved; a load at the same world size
// gives every rank its own, at another world size every rank gets rank 0's.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

namespace tdist::checkpoint {

struct ExtraState {
  /// Optimizer steps taken.
  int64_t step = 0;
  /// Where the data loader is (samples or batches consumed; the trainer decides).
  int64_t data_position = 0;
  /// Named generator states, e.g. "torch.cpu" -> capture_torch_rng_state().
  std::map<std::string, std::vector<uint8_t>> rng_states;
  /// Anything else (learning-rate schedule, config). Must be a JSON object.
  nlohmann::json user = nlohmann::json::object();
  /// The optimizer's param groups as PyTorch's get_optimizer_state_dict lays them out (a list
  /// of objects: each group's options, and "params", its parameters' names); null when no
  /// optimizer was saved. save_module fills it, load_module restores it
  /// (tdist/checkpoint/optimizer_param_groups.h).
  nlohmann::json optimizer_param_groups;

  nlohmann::json to_json() const;
  static ExtraState from_json(const nlohmann::json& j);
  bool operator==(const ExtraState& other) const;
};

/// The state of `device`'s default generator (the bytes of at::Generator::get_state()): the
/// CPU's, or a GPU's ("cuda:0"; a run that draws random numbers on its GPU, such as dropout
/// on CUDA tensors, saves that one too to resume bit for bit).
std::vector<uint8_t> capture_torch_rng_state(const c10::Device& device = c10::Device(c10::kCPU));
/// Restores what capture_torch_rng_state(device) returned.
void restore_torch_rng_state(const std::vector<uint8_t>& state,
                             const c10::Device& device = c10::Device(c10::kCPU));

}  // namespace tdist::checkpoint

#include "tdist/checkpoint/extra_state.h"

#include <cstring>

#include <ATen/ops/empty.h>

#include "checkpoint/metadata_codec.h"
#include "tdist/detail/util/torch_compat.h"
#include "tdist/error.h"

namespace tdist::checkpoint {

nlohmann::json ExtraState::to_json() const {
  nlohmann::json rng = nlohmann::json::object();
  for (const auto& [name, bytes] : rng_states) rng[name] = detail::base64_encode(bytes);
  nlohmann::json j = {
      {"step", step}, {"data_position", data_position}, {"rng_states", rng}, {"user", user}};
  if (!optimizer_param_groups.is_null()) j["optimizer_param_groups"] = optimizer_param_groups;
  return j;
}

ExtraState ExtraState::from_json(const nlohmann::json& j) {
  ExtraState e;
  e.step = j.at("step").get<int64_t>();
  e.data_position = j.at("data_position").get<int64_t>();
  for (const auto& [name, text] : j.at("rng_states").items()) {
    e.rng_states[name] = detail::base64_decode(text.get<std::string>());
  }
  e.user = j.at("user");
  if (j.contains("optimizer_param_groups")) e.optimizer_param_groups = j["optimizer_param_groups"];
  return e;
}

bool ExtraState::operator==(const ExtraState& other) const {
  return step == other.step && data_position == other.data_position &&
         rng_states == other.rng_states && user == other.user &&
         optimizer_param_groups == other.optimizer_param_groups;
}

std::vector<uint8_t> capture_torch_rng_state(const c10::Device& device) {
  const at::Tensor state = util::generator_state(device).contiguous();
  const auto* p = state.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + state.numel());
}

void restore_torch_rng_state(const std::vector<uint8_t>& state, const c10::Device& device) {
  at::Tensor t = at::empty({static_cast<int64_t>(state.size())}, at::kByte);
  if (!state.empty()) std::memcpy(t.data_ptr<uint8_t>(), state.data(), state.size());
  util::set_generator_state(device, t);
}

}  // namespace tdist::checkpoint

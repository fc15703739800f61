#pragma once

// LibTorch 1.13 keys Optimizer::state() by the parameter's TensorImpl address printed as a
// string; 2.x keys it by the address itself. Both are derived here from the map's key type.
// (Kept beside its only user instead of util/torch_compat.h, which FSDP is editing.)

#include <sstream>
#include <string>
#include <type_traits>

#include <torch/optim/optimizer.h>

namespace tdist::checkpoint::detail {

template <typename Map>
typename Map::key_type optimizer_state_key_for(const at::Tensor& param) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // what c10::guts::to_string(impl) gives in 1.13
    out << static_cast<void*>(param.unsafeGetTensorImpl());
    return out.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

inline auto optimizer_state_key(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  using Map = std::decay_t<decltype(optimizer.state())>;
  return optimizer_state_key_for<Map>(param);
}

}  // namespace tdist::checkpoint::detail

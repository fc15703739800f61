#pragma once

// --mixed-precision bf16: LibTorch's autocast (of the CPU or of CUDA, the device the model
// computes on) runs matmuls and linear layers in bfloat16 inside the guarded region (the
// forward); parameters, gradients and optimizer state stay float32. The autocast call itself
// is tdist::util::set_autocast (torch_compat.h).

#include <c10/core/DeviceType.h>

namespace gpt {

class AutocastGuard {
 public:
  /// enabled=false: does nothing.
  explicit AutocastGuard(bool enabled, c10::DeviceType device = c10::kCPU);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_;
  c10::DeviceType device_;
  bool previous_ = false;
};

}  // namespace gpt

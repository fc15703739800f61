#pragma once

// --mixed-precision bf16 on the CPU: LibTorch's autocast runs matmuls and linear layers in
// bfloat16 inside the guarded region (the forward); parameters, gradients and optimizer
// state stay float32. The autocast call itself is tdist::util::set_cpu_autocast (torch_compat.h).

namespace gpt {

class AutocastGuard {
 public:
  /// enabled=false: does nothing.
  explicit AutocastGuard(bool enabled);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_;
  bool previous_ = false;
};

}  // namespace gpt

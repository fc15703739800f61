#include "gpt/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace gpt {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define GPT_AUTOCAST_DEVICE_API 1
#endif

AutocastGuard::AutocastGuard(bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
#ifdef GPT_AUTOCAST_DEVICE_API
  previous_ = at::autocast::is_autocast_enabled(at::kCPU);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
#else
  previous_ = at::autocast::is_cpu_enabled();
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
#endif
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
#ifdef GPT_AUTOCAST_DEVICE_API
  at::autocast::set_autocast_enabled(at::kCPU, previous_);
#else
  at::autocast::set_cpu_enabled(previous_);
#endif
  if (!previous_) at::autocast::clear_cache();  // drop the bf16 copies of the weights
}

}  // namespace gpt

#include "gpt/autocast.h"

#include <ATen/autocast_mode.h>
#include "tdist/detail/util/torch_compat.h"

namespace gpt {

AutocastGuard::AutocastGuard(bool enabled, c10::DeviceType device)
    : enabled_(enabled), device_(device) {
  if (enabled_) previous_ = tdist::util::set_autocast(device_, true, at::kBFloat16);
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  tdist::util::set_autocast(device_, previous_, at::kBFloat16);
  if (!previous_) at::autocast::clear_cache();  // drop the bf16 copies of the weights
}

}  // namespace gpt

#include "gpt/autocast.h"

#include <ATen/autocast_mode.h>
#include "tdist/util/torch_compat.h"

namespace gpt {

AutocastGuard::AutocastGuard(bool enabled) : enabled_(enabled) {
  if (enabled_) previous_ = tdist::util::set_cpu_autocast(true, at::kBFloat16);
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  tdist::util::set_cpu_autocast(previous_, at::kBFloat16);
  if (!previous_) at::autocast::clear_cache();  // drop the bf16 copies of the weights
}

}  // namespace gpt

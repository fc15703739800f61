// Registers "gloo" with comm's backend registry, as every engine does (src/mpi/, src/nccl/):
// comm knows backends by name only and links none of them.

#include <mutex>

#include "tdist/comm/backend.h"
#include "tdist/gloo/gloo_backend.h"

namespace tdist::gloo {

void register_gloo_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (detail::backend_registered(Backend::GLOO)) return;
    Backend::register_backend(Backend::GLOO, make_gloo_backend, /*extended_api=*/true,
                              // CUDA tensors through pinned host memory (Note [Staging
                              // device tensors through the host], comm/host_staged_backend.h).
                              {"cpu", "cuda"});
  });
}

}  // namespace tdist::gloo

// See Note [Backend registration anchor] in src/mpi/registration.cpp: tdist::tdist links with
// -Wl,--undefined=tdist_gloo_registration_anchor so that this file, and its initialiser, are
// part of every program that links it.
extern "C" {
int tdist_gloo_registration_anchor = 0;
}
namespace {
const bool kRegistered = [] {
  tdist::gloo::register_gloo_backend();
  return true;
}();
}  // namespace

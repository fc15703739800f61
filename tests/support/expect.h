#pragma once

// Small helpers shared by tests that check errors and what the machine has.

#include <string>

#include <ATen/Context.h>

#include "tdist/error.h"

namespace tdist::testing {

/// The message of the tdist::Error `fn` throws, or "<no error>" when it returns.
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

/// True when LibTorch has CUDA and sees a GPU (GPU tests skip otherwise).
inline bool has_gpu() {
  return at::hasCUDA() && at::getNumGPUs() > 0;
}

}  // namespace tdist::testing

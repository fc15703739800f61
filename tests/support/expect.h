#pragma once

// Small helpers shared by tests that check errors and what the machine has.

#include <cstdlib>
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

/// The Python the interchange tests run (TDIST_TEST_PYTHON, which CMake sets to the
/// .venv's; else the system's).
inline std::string test_python() {
  const char* p = std::getenv("TDIST_TEST_PYTHON");
  return p ? p : "/usr/bin/python3";
}

/// True when LibTorch has CUDA and sees a GPU (GPU tests skip otherwise).
inline bool has_gpu() {
  return at::hasCUDA() && at::getNumGPUs() > 0;
}

}  // namespace tdist::testing

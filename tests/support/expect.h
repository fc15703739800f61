#pragma once

// Small helpers shared by tests that check errors and what the machine has.

#include <cstdlib>
#include <string>

#include <ATen/Context.h>
#include <gtest/gtest.h>

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

/// Expects `fn` to throw tdist::InvalidArgument whose message contains `needle`.
template <typename Fn>
void expect_invalid_argument(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "accepted; expected an error naming '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
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

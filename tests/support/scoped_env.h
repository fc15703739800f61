#pragma once

// Sets (or unsets) one environment variable for a scope and puts back what was there; and
// the check that a malformed value of one is refused by name.

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "tdist/error.h"

namespace tdist::testing {

class ScopedEnv {
 public:
  /// `value` null: unset for the scope.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

/// While `name` is `value`, `read()` raises InvalidArgument whose message names
/// "<name>='<value>'".
template <class Read>
void expect_env_value_rejected(const char* name, const char* value, Read read) {
  ScopedEnv bad(name, value);
  try {
    read();
    ADD_FAILURE() << name << "='" << value << "' was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(std::string(name) + "='" + value + "'"), std::string::npos)
        << e.what();
  }
}

}  // namespace tdist::testing

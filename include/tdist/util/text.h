#pragma once

// Lists inside error messages and descriptions ("ranks 0, 2", "known backends: gloo, mpi"),
// written one way across the areas.

#include <sstream>
#include <string>
#include <vector>

namespace tdist::util {

/// `values` written with operator<< and separated by `separator`: join({0, 2}) is "0, 2".
template <typename T>
std::string join(const std::vector<T>& values, const std::string& separator = ", ") {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out << separator;
    out << values[i];
  }
  return out.str();
}

}  // namespace tdist::util

#pragma once

// Text helpers shared across the areas: lists inside error messages and descriptions
// ("ranks 0, 2", "known backends: gloo, mpi"), written one way, and suffix tests.

#include <sstream>
#include <string>
#include <vector>

namespace tdist::util {

/// Whether `s` ends with `suffix`.
inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

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

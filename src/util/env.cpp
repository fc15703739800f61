#include "tdist/detail/util/env.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "tdist/error.h"

namespace tdist::util {

std::optional<int64_t> env_integer(const char* name, int64_t min, const char* expected) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(value, &end, 10);
  TDIST_CHECK_ARG(errno == 0 && end != value && *end == '\0' && parsed >= min,
                  std::string(name) + "='" + value + "': expected " + expected);
  return parsed;
}

}  // namespace tdist::util

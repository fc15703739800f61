#include "tdist/error.h"

#include <cstring>

namespace tdist::detail {

std::string stamp(const char* file, int line, const std::string& message) {
  // Keep the path short: from "src/" or "include/" on.
  const char* shown = file;
  for (const char* anchor : {"/src/", "/include/", "/tests/", "/tools/"}) {
    if (const char* p = std::strstr(file, anchor)) {
      shown = p + 1;
      break;
    }
  }
  return message + " [" + shown + ":" + std::to_string(line) + "]";
}

}  // namespace tdist::detail

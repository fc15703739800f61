#include "tdist/error.h"

#include <cstring>

namespace tdist {

std::string message_of(const std::exception_ptr& error, const std::string& fallback) {
  if (!error) return fallback;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return fallback;
  }
}

}  // namespace tdist

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

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
namespace {

/// `file` from the last of the tree's top folders on ("src/", "include/", "examples/"...). The
/// last, because the checkout itself may sit under such a folder (~/src/tdist/src/comm/x.cpp),
/// while no folder of the tree nests another of them.
const char* path_from_source_root(const char* file) {
  const char* shown = file;
  for (const char* anchor :
       {"/src/", "/include/", "/tests/", "/tools/", "/examples/", "/bench/", "/fuzz/"}) {
    for (const char* p = std::strstr(file, anchor); p != nullptr; p = std::strstr(p + 1, anchor)) {
      if (p + 1 > shown) shown = p + 1;
    }
  }
  return shown;
}

}  // namespace

std::string stamp(const char* file, int line, const std::string& message) {
  return message + " [" + path_from_source_root(file) + ":" + std::to_string(line) + "]";
}

}  // namespace tdist::detail

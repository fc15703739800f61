#pragma once

// Reading an integer environment variable strictly, for the areas' environment structs
// (docs/design.md, "Configuration").

#include <cstdint>
#include <optional>

namespace tdist::util {

/// The value of `name` as a whole number of at least `min`; nullopt when unset or empty.
/// Anything else raises InvalidArgument "<name>='<value>': expected <expected>".
std::optional<int64_t> env_integer(const char* name, int64_t min, const char* expected);

}  // namespace tdist::util

#pragma once

// Keys the stores use for their own bookkeeping (workers joined / left). They start with a
// byte no user key is expected to use and are not counted by num_keys().

#include <string>

namespace tdist::detail {

// Short, so they fit even a small TCPStoreOptions::max_key_bytes.
inline const std::string kReservedKeyPrefix = std::string("\x01t/");

inline bool is_reserved_key(const std::string& key) {
  return key.compare(0, kReservedKeyPrefix.size(), kReservedKeyPrefix) == 0;
}

}  // namespace tdist::detail

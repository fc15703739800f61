#pragma once

// Shared-secret challenge-response for the TCP store (see docs/security.md).
//   server -> client: hello with server nonce Ns
//   client -> server: Nc, HMAC(secret, "client" || Ns || Nc)
//   server -> client: HMAC(secret, "server" || Nc || Ns)   (the server proves it knows it too)
// The direction labels keep a reflected MAC from ever being a valid answer.

#include <cstdint>
#include <string>
#include <vector>

namespace tdist::detail {

/// options.secret if non-empty, else $TDIST_STORE_SECRET, else the contents of the file named
/// by $TDIST_STORE_SECRET_FILE (trailing newline removed); empty: no authentication.
std::string resolve_store_secret(const std::string& explicit_secret);

/// Cryptographically random bytes (OpenSSL RAND_bytes); throws StoreError on failure.
std::vector<uint8_t> random_bytes(size_t n);

/// HMAC-SHA256(secret, label || a || b).
std::vector<uint8_t> store_mac(const std::string& secret, const char* label,
                               const std::vector<uint8_t>& a, const std::vector<uint8_t>& b);

/// Constant-time comparison.
bool macs_equal(const std::vector<uint8_t>& a, const uint8_t* b, size_t size);

}  // namespace tdist::detail

#include "store/store_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tdist/error.h"

namespace tdist::detail {

std::string resolve_store_secret(const std::string& explicit_secret) {
  if (!explicit_secret.empty()) return explicit_secret;
  if (const char* env = std::getenv("TDIST_STORE_SECRET"); env != nullptr && *env != '\0') {
    return env;
  }
  const char* file = std::getenv("TDIST_STORE_SECRET_FILE");
  if (file == nullptr || *file == '\0') return "";
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    TDIST_THROW(StoreError, std::string("TCPStore: cannot read the secret file '") + file +
                                "' named by TDIST_STORE_SECRET_FILE; create it (mode 0600) or "
                                "unset the variable");
  }
  std::stringstream text;
  text << in.rdbuf();
  std::string secret = text.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) {
    TDIST_THROW(StoreError, std::string("TCPStore: the secret file '") + file +
                                "' named by TDIST_STORE_SECRET_FILE is empty");
  }
  return secret;
}

std::vector<uint8_t> random_bytes(size_t n) {
  std::vector<uint8_t> out(n);
  if (RAND_bytes(out.data(), static_cast<int>(n)) != 1) {
    TDIST_THROW(StoreError, "TCPStore: OpenSSL RAND_bytes failed to produce a nonce");
  }
  return out;
}

std::vector<uint8_t> store_mac(const std::string& secret, const char* label,
                               const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  std::vector<uint8_t> message(label, label + std::char_traits<char>::length(label));
  message.insert(message.end(), a.begin(), a.end());
  message.insert(message.end(), b.begin(), b.end());
  std::vector<uint8_t> mac(EVP_MAX_MD_SIZE);
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), message.data(),
           message.size(), mac.data(), &length) == nullptr) {
    TDIST_THROW(StoreError, "TCPStore: OpenSSL HMAC-SHA256 failed");
  }
  mac.resize(length);
  return mac;
}

bool macs_equal(const std::vector<uint8_t>& a, const uint8_t* b, size_t size) {
  return a.size() == size && CRYPTO_memcmp(a.data(), b, size) == 0;
}

}  // namespace tdist::detail

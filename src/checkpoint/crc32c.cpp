#include "checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#include <smmintrin.h>
#include <wmmintrin.h>
#endif

namespace tdist::checkpoint::detail {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;     // reflected Castagnoli
constexpr uint32_t kZipPolynomial = 0xEDB88320u;  // reflected IEEE 802.3, zip's CRC-32

using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables make_tables(uint32_t polynomial) {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ polynomial : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  }
  return t;
}

/// Slicing-by-8 over either polynomial's tables.
uint32_t crc_software(const Tables& t, uint32_t crc, const uint8_t* p, size_t n) {
  crc = ~crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= crc;
    crc = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
          t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

uint32_t crc32c_software(uint32_t crc, const uint8_t* p, size_t n) {
  static const Tables t = make_tables(kPolynomial);
  return crc_software(t, crc, p, n);
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = ~crc & 0xffffffffu;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

bool has_sse42() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  return (c & bit_SSE4_2) != 0;
}

bool has_pclmul() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  return (c & bit_PCLMUL) != 0 && (c & bit_SSE4_1) != 0;
}

__attribute__((target("sse4.1,pclmul"))) inline __m128i load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

/// x folded by k onto the next 128 bits.
__attribute__((target("sse4.1,pclmul"))) inline __m128i fold16(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x11), next),
                       _mm_clmulepi64_si128(x, k, 0x00));
}

// Zip's CRC-32 by carry-less multiplication: four 128-bit lanes folded 64 bytes at a time,
// then to 128 and 64 bits, then a Barrett reduction (Intel's "Fast CRC Computation for
// Generic Polynomials Using PCLMULQDQ", with the bit-reflected constants for 0xEDB88320).
// `len` >= 64 and a multiple of 16; `crc` and the result are not inverted.
__attribute__((target("sse4.1,pclmul"))) uint32_t zip_crc32_fold(const uint8_t* buf, size_t len,
                                                                 uint32_t crc) {
  alignas(16) static const uint64_t k1k2[] = {0x0154442bd4, 0x01c6e41596};
  alignas(16) static const uint64_t k3k4[] = {0x01751997d0, 0x00ccaa009e};
  alignas(16) static const uint64_t k5k0[] = {0x0163cd6124, 0x0000000000};
  alignas(16) static const uint64_t poly[] = {0x01db710641, 0x01f7011641};
  __m128i x1 = _mm_xor_si128(load16(buf), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x2 = load16(buf + 16), x3 = load16(buf + 32), x4 = load16(buf + 48);
  __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(k1k2));
  for (buf += 64, len -= 64; len >= 64; buf += 64, len -= 64) {
    x1 = fold16(x1, k, load16(buf));
    x2 = fold16(x2, k, load16(buf + 16));
    x3 = fold16(x3, k, load16(buf + 32));
    x4 = fold16(x4, k, load16(buf + 48));
  }
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(k3k4));
  x1 = fold16(fold16(fold16(x1, k, x2), k, x3), k, x4);
  for (; len >= 16; buf += 16, len -= 16) x1 = fold16(x1, k, load16(buf));
  // 128 -> 64 bits.
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
  x2 = _mm_clmulepi64_si128(x1, k, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
  k = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k5k0));
  x2 = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x00), x2);
  // Barrett reduction to 32 bits.
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(poly));
  x2 = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x10), low32);
  x1 = _mm_xor_si128(x1, _mm_clmulepi64_si128(x2, k, 0x00));
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}
#endif

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  static const bool hw = has_sse42();
  if (hw) return crc32c_sse42(crc, p, size);
#endif
  return crc32c_software(crc, p, size);
}

uint32_t zip_crc32(uint32_t crc, const void* data, size_t size) {
  static const Tables t = make_tables(kZipPolynomial);
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  static const bool hw = has_pclmul();
  if (hw && size >= 64) {
    const size_t folded = size & ~size_t(15);
    crc = ~zip_crc32_fold(p, folded, ~crc);
    p += folded;
    size -= folded;
  }
#endif
  return crc_software(t, crc, p, size);
}

}  // namespace tdist::checkpoint::detail

#include "checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
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

// Note [Folding CRCs]: a reflected CRC-32 by carry-less multiplication (Intel's "Fast CRC
// Computation for Generic Polynomials Using PCLMULQDQ"): lanes of 128 bits are folded forward
// by D bits with the pair {x^(D+32), x^(D-32)} mod P (bit-reflected, shifted left by one),
// then to 128 and 64 bits, then a Barrett reduction. Only the constants depend on the
// polynomial, so they are derived from it (fold_constants) rather than written out, and one
// folding code serves zip's CRC-32 and CRC32C. Folding 512 bits a step with VPCLMULQDQ runs
// several times faster than SSE4.2's crc32 instruction, whose one stream waits three cycles
// for each eight bytes.
struct FoldConstants {
  alignas(16) uint64_t fold128[2];
  alignas(16) uint64_t fold256[2];
  alignas(16) uint64_t fold384[2];
  alignas(16) uint64_t fold512[2];
  alignas(16) uint64_t fold2048[2];
  alignas(16) uint64_t fold64[2];   // {x^64 mod P, 0}: 96 bits onto 64
  alignas(16) uint64_t barrett[2];  // {P, floor(x^64 / P)}, reflected
};

/// x^n mod P, P = x^32 + `normal` (not reflected).
uint32_t xpow_mod(int n, uint32_t normal) {
  uint64_t r = 1;
  for (int i = 0; i < n; ++i) {
    r <<= 1;
    if (r & (1ull << 32)) r ^= (1ull << 32) | normal;
  }
  return static_cast<uint32_t>(r);
}

uint64_t reflect(uint64_t v, int bits) {
  uint64_t r = 0;
  for (int i = 0; i < bits; ++i) r |= ((v >> i) & 1) << (bits - 1 - i);
  return r;
}

/// x^n mod P as the folds multiply by it: reflected and shifted left by one.
uint64_t power_constant(int n, uint32_t normal) {
  return reflect(xpow_mod(n, normal), 32) << 1;
}

FoldConstants fold_constants(uint32_t reflected_polynomial) {
  const auto normal = static_cast<uint32_t>(reflect(reflected_polynomial, 32));
  FoldConstants c{};
  auto pair = [&](uint64_t* out, int d) {
    out[0] = power_constant(d + 32, normal);
    out[1] = power_constant(d - 32, normal);
  };
  pair(c.fold128, 128);
  pair(c.fold256, 256);
  pair(c.fold384, 384);
  pair(c.fold512, 512);
  pair(c.fold2048, 2048);
  c.fold64[0] = power_constant(64, normal);
  // floor(x^64 / P) by long division: a 33-bit quotient.
  const unsigned __int128 p = (static_cast<unsigned __int128>(1) << 32) | normal;
  unsigned __int128 r = static_cast<unsigned __int128>(1) << 64;
  uint64_t q = 0;
  for (int i = 64; i >= 32; --i) {
    if ((r >> i) & 1) {
      q |= 1ull << (i - 32);
      r ^= p << (i - 32);
    }
  }
  c.barrett[0] = (static_cast<uint64_t>(reflected_polynomial) << 1) | 1;
  c.barrett[1] = reflect(q, 33);
  return c;
}

const FoldConstants& constants_of(CrcPolynomial polynomial) {
  static const FoldConstants castagnoli = fold_constants(kPolynomial);
  static const FoldConstants zip = fold_constants(kZipPolynomial);
  return polynomial == CrcPolynomial::kZip ? zip : castagnoli;
}

__attribute__((target("sse4.1,pclmul"))) inline __m128i load_pair(const uint64_t* pair) {
  return _mm_load_si128(reinterpret_cast<const __m128i*>(pair));
}

/// `x` (the fold of everything before `buf`) folded over the 16-byte blocks of `buf` (`len` a
/// multiple of 16), then reduced to the 32-bit CRC, not inverted.
__attribute__((target("sse4.1,pclmul"))) uint32_t finish_fold(const FoldConstants& c, __m128i x1,
                                                              const uint8_t* buf, size_t len) {
  __m128i k = load_pair(c.fold128);
  for (; len >= 16; buf += 16, len -= 16) x1 = fold16(x1, k, load16(buf));
  // 128 -> 64 bits.
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
  __m128i x2 = _mm_clmulepi64_si128(x1, k, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
  k = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c.fold64));
  x2 = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x00), x2);
  // Barrett reduction to 32 bits.
  k = load_pair(c.barrett);
  x2 = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x10), low32);
  x1 = _mm_xor_si128(x1, _mm_clmulepi64_si128(x2, k, 0x00));
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

/// Four 128-bit lanes, 64 bytes a step. `len` >= 64 and a multiple of 16; `crc` and the
/// result are not inverted.
__attribute__((target("sse4.1,pclmul"))) uint32_t crc_fold(const FoldConstants& c,
                                                           const uint8_t* buf, size_t len,
                                                           uint32_t crc) {
  __m128i x1 = _mm_xor_si128(load16(buf), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x2 = load16(buf + 16), x3 = load16(buf + 32), x4 = load16(buf + 48);
  __m128i k = load_pair(c.fold512);
  for (buf += 64, len -= 64; len >= 64; buf += 64, len -= 64) {
    x1 = fold16(x1, k, load16(buf));
    x2 = fold16(x2, k, load16(buf + 16));
    x3 = fold16(x3, k, load16(buf + 32));
    x4 = fold16(x4, k, load16(buf + 48));
  }
  k = load_pair(c.fold128);
  x1 = fold16(fold16(fold16(x1, k, x2), k, x3), k, x4);
  return finish_fold(c, x1, buf, len);
}

#define TDIST_VPCLMUL_TARGET __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.1")))

TDIST_VPCLMUL_TARGET inline __m512i broadcast_pair(const uint64_t* pair) {
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(pair)));
}

/// Every 128-bit lane of x folded by k onto the lane of `next` at the same place.
TDIST_VPCLMUL_TARGET inline __m512i fold64(__m512i x, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                   _mm512_clmulepi64_epi128(x, k, 0x11), next, 0x96);
}

/// Sixteen 128-bit lanes in four 512-bit registers, 256 bytes a step (VPCLMULQDQ). `len`
/// >= 256 and a multiple of 16; `crc` and the result are not inverted.
TDIST_VPCLMUL_TARGET uint32_t crc_fold_avx512(const FoldConstants& c, const uint8_t* buf,
                                              size_t len, uint32_t crc) {
  __m512i z0 = _mm512_xor_si512(_mm512_loadu_si512(buf),
                                _mm512_castsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  __m512i z1 = _mm512_loadu_si512(buf + 64), z2 = _mm512_loadu_si512(buf + 128),
          z3 = _mm512_loadu_si512(buf + 192);
  const __m512i k2048 = broadcast_pair(c.fold2048);
  for (buf += 256, len -= 256; len >= 256; buf += 256, len -= 256) {
    z0 = fold64(z0, k2048, _mm512_loadu_si512(buf));
    z1 = fold64(z1, k2048, _mm512_loadu_si512(buf + 64));
    z2 = fold64(z2, k2048, _mm512_loadu_si512(buf + 128));
    z3 = fold64(z3, k2048, _mm512_loadu_si512(buf + 192));
  }
  const __m512i k512 = broadcast_pair(c.fold512);
  z0 = fold64(fold64(fold64(z0, k512, z1), k512, z2), k512, z3);
  for (; len >= 64; buf += 64, len -= 64) z0 = fold64(z0, k512, _mm512_loadu_si512(buf));
  // The four lanes onto the last: by 384, 256 and 128 bits.
  const __m128i lane3 = _mm512_extracti32x4_epi32(z0, 3);
  __m128i x = fold16(_mm512_extracti32x4_epi32(z0, 0), load_pair(c.fold384), lane3);
  x = fold16(_mm512_extracti32x4_epi32(z0, 1), load_pair(c.fold256), x);
  x = fold16(_mm512_extracti32x4_epi32(z0, 2), load_pair(c.fold128), x);
  return finish_fold(c, x, buf, len);
}
#undef TDIST_VPCLMUL_TARGET

bool has_vpclmul() {
  __builtin_cpu_init();
  return has_pclmul() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("vpclmulqdq");
}
#endif

}  // namespace

std::vector<CrcKind> available_crc_kinds(CrcPolynomial polynomial) {
  std::vector<CrcKind> kinds = {CrcKind::kTables};
#if defined(__x86_64__)
  if (polynomial == CrcPolynomial::kCastagnoli && has_sse42()) kinds.push_back(CrcKind::kSse42);
  if (has_pclmul()) kinds.push_back(CrcKind::kPclmul);
  if (has_vpclmul()) kinds.push_back(CrcKind::kVpclmul);
#endif
  return kinds;
}

uint32_t crc32(CrcPolynomial polynomial, uint32_t crc, const void* data, size_t size,
               CrcKind kind) {
  static const Tables castagnoli_tables = make_tables(kPolynomial);
  static const Tables zip_tables = make_tables(kZipPolynomial);
  const bool zip = polynomial == CrcPolynomial::kZip;
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  if ((kind == CrcKind::kPclmul || kind == CrcKind::kVpclmul) && size >= 64) {
    const FoldConstants& c = constants_of(polynomial);
    const size_t folded = size & ~size_t(15);
    crc = kind == CrcKind::kVpclmul && size >= 256 ? ~crc_fold_avx512(c, p, folded, ~crc)
                                                   : ~crc_fold(c, p, folded, ~crc);
    p += folded;
    size -= folded;
  }
  // The tail (or everything, by the instruction) with SSE4.2 where CRC32C has it.
  static const bool sse42 = has_sse42();
  if (!zip && sse42 && kind != CrcKind::kTables) return crc32c_sse42(crc, p, size);
#endif
  return crc_software(zip ? zip_tables : castagnoli_tables, crc, p, size);
}

uint32_t crc32c(uint32_t crc, const void* data, size_t size) {
  static const CrcKind best = available_crc_kinds(CrcPolynomial::kCastagnoli).back();
  return crc32(CrcPolynomial::kCastagnoli, crc, data, size, best);
}

uint32_t zip_crc32(uint32_t crc, const void* data, size_t size) {
  static const CrcKind best = available_crc_kinds(CrcPolynomial::kZip).back();
  return crc32(CrcPolynomial::kZip, crc, data, size, best);
}

}  // namespace tdist::checkpoint::detail

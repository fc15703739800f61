#pragma once

// CRC32C (Castagnoli), the checksum of tdist's own checkpoint blocks, and zip's CRC-32
// (IEEE 802.3), for the records of torch.save archives; each computed with the fastest
// instructions this CPU has (Note [Folding CRCs] in crc32c.cpp).

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tdist::checkpoint::detail {

/// Extends `crc` (0 to start) over data.
uint32_t crc32c(uint32_t crc, const void* data, size_t size);

/// Zip's CRC-32: extends `crc` (0 to start) over data.
uint32_t zip_crc32(uint32_t crc, const void* data, size_t size);

enum class CrcPolynomial { kCastagnoli, kZip };

/// How a CRC is computed: slicing-by-8 tables, SSE4.2's crc32 instruction (Castagnoli only),
/// 128-bit carry-less multiplication (PCLMULQDQ) or 512-bit (AVX-512 VPCLMULQDQ).
enum class CrcKind { kTables, kSse42, kPclmul, kVpclmul };
/// The kinds this CPU runs for `polynomial`, fastest last; tests compare each.
std::vector<CrcKind> available_crc_kinds(CrcPolynomial polynomial);
uint32_t crc32(CrcPolynomial polynomial, uint32_t crc, const void* data, size_t size, CrcKind kind);

}  // namespace tdist::checkpoint::detail

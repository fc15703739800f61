#pragma once

// CRC32C (Castagnoli), hardware-accelerated with SSE4.2 when the CPU has it; and zip's
// CRC-32 (IEEE), for the records of torch.save archives.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tdist::checkpoint::detail {

/// Extends `crc` (0 to start) over data.
uint32_t crc32c(uint32_t crc, const void* data, size_t size);

/// Zip's CRC-32: extends `crc` (0 to start) over data, with the fastest kind this CPU has.
uint32_t zip_crc32(uint32_t crc, const void* data, size_t size);

/// How zip_crc32 computes: slicing-by-8 tables, 128-bit carry-less multiplication (PCLMULQDQ),
/// or 512-bit (AVX-512 VPCLMULQDQ).
enum class ZipCrcKind { kTables, kPclmul, kVpclmul };
/// The kinds this CPU runs, fastest last; tests compare each.
std::vector<ZipCrcKind> available_zip_crc_kinds();
uint32_t zip_crc32(uint32_t crc, const void* data, size_t size, ZipCrcKind kind);

}  // namespace tdist::checkpoint::detail

#pragma once

// CRC32C (Castagnoli), hardware-accelerated with SSE4.2 when the CPU has it; and zip's
// CRC-32 (IEEE), for the records of torch.save archives.

#include <cstddef>
#include <cstdint>

namespace tdist::checkpoint::detail {

/// Extends `crc` (0 to start) over data.
uint32_t crc32c(uint32_t crc, const void* data, size_t size);

/// Zip's CRC-32: extends `crc` (0 to start) over data.
uint32_t zip_crc32(uint32_t crc, const void* data, size_t size);

}  // namespace tdist::checkpoint::detail

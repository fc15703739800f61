#pragma once

// The zip structures torch.save archives use (PKWARE's APPNOTE): signatures and fixed sizes.

#include <cstddef>
#include <cstdint>

namespace tdist::checkpoint::detail::zip {

constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kZip64EndLocator = 0x07064b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint32_t kCentralEntry = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint16_t kZip64Extra = 0x0001;
constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kCentralEntrySize = 46;

/// The little-endian unsigned integer of `bytes` bytes at p (zip's byte order).
inline uint64_t read_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

}  // namespace tdist::checkpoint::detail::zip

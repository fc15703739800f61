#include "checkpoint/zip_check.h"

#include <cstdint>

#include "checkpoint/crc32c.h"
#include "checkpoint/zip_format.h"
#include "tdist/error.h"

namespace tdist::checkpoint::detail {
namespace {

using namespace zip;

class ZipView {
 public:
  ZipView(const void* data, size_t size, const std::string& where)
      : p_(static_cast<const uint8_t*>(data)), size_(size), where_(where) {}

  [[noreturn]] void fail(const std::string& why) const {
    TDIST_THROW(CheckpointError, "checkpoint: " + where_ + " is corrupt (" + why +
                                     "); the checkpoint cannot be loaded, use an older one");
  }
  uint64_t le(uint64_t at, int bytes) const {
    // Offsets come from the file: `at + bytes` could wrap around, so compare by subtraction.
    if (at > size_ || static_cast<uint64_t>(bytes) > size_ - at) {
      fail("a zip structure runs past the end");
    }
    return read_le(p_ + at, bytes);
  }

  void check() const {
    const uint64_t end = find_end();
    uint64_t entries = le(end + 10, 2), cd_offset = le(end + 16, 4);
    if (entries == 0xffff || cd_offset == 0xffffffff) {  // zip64: the real values are elsewhere
      if (end < 20 || le(end - 20, 4) != kZip64EndLocator) fail("no zip64 end record");
      const uint64_t z = le(end - 20 + 8, 8);
      if (le(z, 4) != kZip64End) fail("a bad zip64 end record");
      entries = le(z + 32, 8);
      cd_offset = le(z + 48, 8);
    }
    uint64_t at = cd_offset;
    for (uint64_t i = 0; i < entries; ++i) at = check_entry(at);
  }

 private:
  uint64_t find_end() const {
    if (size_ < 22) fail("too short for a zip archive");
    for (uint64_t at = size_ - 22;; --at) {  // the end record, then at most a 64 KiB comment
      if (le(at, 4) == kEndOfCentralDirectory) return at;
      if (at == 0 || size_ - at > 22 + 65535) break;
    }
    fail("no zip end record");
  }

  /// Checks one central directory entry's record; returns where the next entry starts.
  uint64_t check_entry(uint64_t at) const {
    if (le(at, 4) != kCentralEntry) fail("a bad central directory entry");
    const uint64_t method = le(at + 10, 2), crc = le(at + 16, 4);
    uint64_t compressed = le(at + 20, 4), local = le(at + 42, 4);
    const uint64_t name_len = le(at + 28, 2), extra_len = le(at + 30, 2),
                   comment_len = le(at + 32, 2);
    const std::string name(reinterpret_cast<const char*>(p_ + at + 46),
                           static_cast<size_t>(std::min<uint64_t>(name_len, size_ - at - 46)));
    read_zip64_sizes(at + 46 + name_len, extra_len, le(at + 24, 4), &compressed, &local);
    if (le(local, 4) != kLocalHeader) fail("record '" + name + "' has no local header");
    const uint64_t data = local + 30 + le(local + 26, 2) + le(local + 28, 2);
    if (data > size_ || compressed > size_ - data) {
      fail("record '" + name + "' runs past the end");
    }
    if (method == 0 && zip_crc32(0, p_ + data, static_cast<size_t>(compressed)) != crc) {
      fail("record '" + name + "' fails its CRC-32 check");
    }
    return at + 46 + name_len + extra_len + comment_len;
  }

  /// A zip64 extra field holds, in order, the 64-bit values whose 32-bit fields are all ones.
  void read_zip64_sizes(uint64_t at, uint64_t length, uint64_t uncompressed32, uint64_t* compressed,
                        uint64_t* local) const {
    const uint64_t end = at + length;
    while (at + 4 <= end) {
      const uint64_t id = le(at, 2), n = le(at + 2, 2);
      if (id == kZip64Extra) {
        uint64_t v = at + 4;
        if (uncompressed32 == 0xffffffff) v += 8;
        if (*compressed == 0xffffffff) *compressed = le(v, 8), v += 8;
        if (*local == 0xffffffff) *local = le(v, 8);
        return;
      }
      at += 4 + n;
    }
  }

  const uint8_t* p_;
  uint64_t size_;
  const std::string& where_;
};

}  // namespace

void check_zip_crcs(const void* data, size_t size, const std::string& where) {
  ZipView(data, size, where).check();
}

}  // namespace tdist::checkpoint::detail

#pragma once

// Fills in the CRC-32 fields of a zip archive streamed by LibTorch's PyTorchStreamWriter
// told not to compute them (Note [Filling zip CRCs] in zip_crc_filler.cpp).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tdist::checkpoint::detail {

/// Sits between the writer and `sink`: write() takes the writer's calls in order, finish()
/// (after writeEndOfFile) sends the central directory. Every stored record reaches `sink`
/// with its CRC-32 in its data descriptor and central directory entry; a stream that is not
/// such an archive is a CheckpointError.
class ZipCrcFiller {
 public:
  explicit ZipCrcFiller(std::function<void(const void*, size_t)> sink);
  void write(const void* data, size_t size);
  void finish();

 private:
  enum class State { kHeader, kData, kCentralDirectory };
  /// The bytes of the local header being held: the fixed part until that is in, then all.
  size_t held_header_size() const;
  void take_header_bytes(const uint8_t*& p, size_t& n);
  void start_record();
  bool is_descriptor(const uint8_t* p, size_t n) const;
  void end_record(const uint8_t* descriptor, size_t n);
  void patch_central_directory();

  std::function<void(const void*, size_t)> sink_;
  State state_ = State::kHeader;
  std::vector<uint8_t> held_;  // a local header, or the central directory onwards
  uint32_t crc_ = 0;           // of the current record's data so far
  uint64_t data_bytes_ = 0;
  std::vector<uint32_t> crcs_;      // every record's, in order
  std::vector<std::string> names_;  // every record's, in order
};

}  // namespace tdist::checkpoint::detail

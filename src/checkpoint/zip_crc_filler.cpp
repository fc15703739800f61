#include "checkpoint/zip_crc_filler.h"

#include <algorithm>
#include <cstring>

#include "checkpoint/crc32c.h"
#include "checkpoint/zip_format.h"
#include "tdist/error.h"

namespace tdist::checkpoint::detail {
namespace {

// Note [Filling zip CRCs]: LibTorch's PyTorchStreamWriter computes each record's CRC-32
// with miniz's table code, ~3.4 GB/s here: 75 ms of a 256 MiB save, a quarter of its time
// with fsync. Told not to (compute_crc32 = false) it writes 0 where the CRC goes; this sink
// fills it in with zip_crc32 (carry-less multiplication, Note [Folding CRCs]) as the bytes
// pass, without holding or copying any record's data. The writer never seeks: each record is
// a local header (CRC and sizes left 0, flag bit 3), its data, then a data descriptor that
// carries the CRC and sizes (an empty record has no descriptor: its header's zeros are right);
// the central directory, written last, repeats the CRCs. So the data's CRC is accumulated
// call by call until the descriptor arrives, recognised by its signature, its length and a
// size equal to the bytes counted (a data call cannot also be that: were a record's bytes
// ever to look so, the next call would not be a local header and the save fails by name, not
// silently); the central directory is held until finish() and patched entry by entry in
// record order, each name checked. The archive is the writer's byte for byte, except that
// LibTorch derives its `.data/serialization_id` record from the CRCs it computed, so that id,
// a best-effort name for the archive that no reader checks, is made from zeros.
using namespace zip;

constexpr uint32_t kDataDescriptor = 0x08074b50;

void put_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

[[noreturn]] void unexpected(const std::string& why) {
  TDIST_THROW(CheckpointError,
              "checkpoint: LibTorch's zip writer produced an archive tdist cannot complete (" +
                  why + "); this LibTorch is not one tdist was built for, rebuild tdist");
}

}  // namespace

ZipCrcFiller::ZipCrcFiller(std::function<void(const void*, size_t)> sink)
    : sink_(std::move(sink)) {}

void ZipCrcFiller::write(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (state_ == State::kData && is_descriptor(p, size)) return end_record(p, size);
  while (size > 0) {
    switch (state_) {
      case State::kHeader:
        take_header_bytes(p, size);
        break;
      case State::kData:
        crc_ = zip_crc32(crc_, p, size);
        data_bytes_ += size;
        sink_(p, size);
        size = 0;
        break;
      case State::kCentralDirectory:
        held_.insert(held_.end(), p, p + size);
        size = 0;
        break;
    }
  }
}

size_t ZipCrcFiller::held_header_size() const {
  // The fixed part first, then the name and extra field it announces.
  if (held_.size() < kLocalHeaderSize) return kLocalHeaderSize;
  return kLocalHeaderSize + read_le(&held_[26], 2) + read_le(&held_[28], 2);
}

void ZipCrcFiller::take_header_bytes(const uint8_t*& p, size_t& n) {
  const size_t take = std::min(n, held_header_size() - held_.size());
  held_.insert(held_.end(), p, p + take);
  p += take;
  n -= take;
  if (held_.size() < 4) return;
  const uint64_t signature = read_le(held_.data(), 4);
  if (signature == kCentralEntry) {
    state_ = State::kCentralDirectory;
    return;
  }
  if (signature != kLocalHeader) unexpected("no local header where a record should start");
  if (held_.size() >= kLocalHeaderSize && held_.size() == held_header_size()) start_record();
}

void ZipCrcFiller::start_record() {
  if (read_le(&held_[8], 2) != 0) unexpected("a compressed record");
  names_.emplace_back(reinterpret_cast<const char*>(&held_[kLocalHeaderSize]),
                      read_le(&held_[26], 2));
  const bool described = (read_le(&held_[6], 2) & 0x8) != 0;
  // An empty record has no descriptor: its header's CRC and sizes are already right (0).
  const bool empty =
      read_le(&held_[14], 4) == 0 && read_le(&held_[18], 4) == 0 && read_le(&held_[22], 4) == 0;
  if (!described && !empty) unexpected("a record with data but without a data descriptor");
  sink_(held_.data(), held_.size());
  held_.clear();
  crc_ = 0;
  data_bytes_ = 0;
  if (described) {
    state_ = State::kData;
  } else {
    crcs_.push_back(0);
  }
}

bool ZipCrcFiller::is_descriptor(const uint8_t* p, size_t n) const {
  // Signature, CRC, then the stored and original sizes: 4 bytes each, or 8 under zip64.
  if ((n != 16 && n != 24) || read_le(p, 4) != kDataDescriptor) return false;
  return read_le(p + 8, n == 16 ? 4 : 8) == data_bytes_;
}

void ZipCrcFiller::end_record(const uint8_t* descriptor, size_t n) {
  uint8_t patched[24];
  std::memcpy(patched, descriptor, n);
  if (read_le(patched + 4, 4) != 0) unexpected("a record whose CRC-32 was already computed");
  put_le32(patched + 4, crc_);
  crcs_.push_back(crc_);
  sink_(patched, n);
  state_ = State::kHeader;
}

void ZipCrcFiller::patch_central_directory() {
  size_t at = 0;
  for (size_t i = 0; i < crcs_.size(); ++i) {
    if (at + kCentralEntrySize > held_.size() || read_le(&held_[at], 4) != kCentralEntry)
      unexpected("fewer central directory entries than records");
    const size_t name = read_le(&held_[at + 28], 2), extra = read_le(&held_[at + 30], 2),
                 comment = read_le(&held_[at + 32], 2);
    if (names_[i].size() != name || at + kCentralEntrySize + name > held_.size() ||
        std::memcmp(&held_[at + kCentralEntrySize], names_[i].data(), name) != 0)
      unexpected("the central directory names another record than '" + names_[i] + "'");
    if (read_le(&held_[at + 16], 4) != 0) unexpected("a record whose CRC-32 was already computed");
    put_le32(&held_[at + 16], crcs_[i]);
    at += kCentralEntrySize + name + extra + comment;
  }
  if (at + 4 <= held_.size() && read_le(&held_[at], 4) == kCentralEntry)
    unexpected("more central directory entries than records");
}

void ZipCrcFiller::finish() {
  if (state_ != State::kCentralDirectory) unexpected("the archive ended inside a record");
  patch_central_directory();
  sink_(held_.data(), held_.size());
  held_.clear();
}

}  // namespace tdist::checkpoint::detail

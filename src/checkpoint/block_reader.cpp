#include "checkpoint/block_reader.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <ATen/ATen.h>

#include "checkpoint/crc32c.h"
#include "tdist/error.h"

namespace tdist::checkpoint::detail {

BlockReader::BlockReader(std::string dir, const std::map<std::string, FileInfo>& files, bool verify)
    : dir_(std::move(dir)), files_(files), verify_(verify) {}

const InputFile& BlockReader::open(const std::string& file) {
  auto it = open_.find(file);
  if (it != open_.end()) return *it->second;
  if (files_.count(file) == 0) {
    TDIST_THROW(CheckpointError, "checkpoint: metadata of '" + dir_ + "' refers to file '" + file +
                                     "' it does not list; the metadata is corrupt");
  }
  const std::string path = (std::filesystem::path(dir_) / file).string();
  if (!std::filesystem::exists(path)) {
    TDIST_THROW(CheckpointError, "checkpoint: data file '" + path +
                                     "' is missing; the checkpoint is incomplete or was "
                                     "partly deleted, use an older one");
  }
  auto in = std::make_unique<InputFile>(path);
  const int64_t expected = files_.at(file).size;
  if (in->size() != expected) {
    TDIST_THROW(CheckpointError, "checkpoint: data file '" + path + "' has " +
                                     std::to_string(in->size()) + " bytes, the metadata says " +
                                     std::to_string(expected) +
                                     "; the file is truncated or corrupt, use an older one");
  }
  return *open_.emplace(file, std::move(in)).first->second;
}

void BlockReader::check_size(const std::string& file) {
  open(file);
}

const InputFile& BlockReader::open_range(const std::string& file, int64_t offset, int64_t size) {
  const InputFile& in = open(file);
  if (offset < 0 || size < 0 || offset + size > in.size()) {
    TDIST_THROW(CheckpointError, "checkpoint: metadata points at bytes outside '" + in.path() +
                                     "'; the metadata is corrupt");
  }
  return in;
}

at::Tensor BlockReader::read_unverified(const InputFile& in, int64_t offset, at::Tensor out) {
  in.read_at(offset, out.data_ptr(), out.numel());
  bytes_read_ += out.numel();
  return out;
}

at::Tensor BlockReader::read(const std::string& file, int64_t offset, int64_t size) {
  const InputFile& in = open_range(file, offset, size);
  const FileInfo& info = files_.at(file);
  if (!verify_ || size == 0 || info.block_bytes <= 0) {  // <= 0: a format without checksums
    return read_unverified(in, offset, at::empty({size}, at::kByte));
  }
  const int64_t bs = info.block_bytes;
  const int64_t first = offset / bs;
  const int64_t last = (offset + size - 1) / bs;
  const int64_t begin = first * bs;
  const int64_t end = std::min((last + 1) * bs, in.size());
  at::Tensor buffer = at::empty({end - begin}, at::kByte);
  auto* p = buffer.data_ptr<uint8_t>();
  // Read a group of blocks, then check them while they are still in the cache: one pass over
  // memory instead of two.
  const int64_t group = std::max<int64_t>(1, (int64_t{1} << 20) / bs);
  for (int64_t b = first; b <= last; ++b) {
    const int64_t lo = b * bs - begin;
    const int64_t n = std::min(bs, end - b * bs);
    if ((b - first) % group == 0) {
      const int64_t count = std::min(end - b * bs, group * bs);
      in.read_at(b * bs, p + lo, count);
      bytes_read_ += count;
    }
    if (b >= static_cast<int64_t>(info.block_crc32c.size()) ||
        crc32c(0, p + lo, static_cast<size_t>(n)) != info.block_crc32c[b]) {
      TDIST_THROW(CheckpointError, "checkpoint: data file '" + in.path() + "' is corrupt: block " +
                                       std::to_string(b) + " (bytes " + std::to_string(b * bs) +
                                       ".." + std::to_string(b * bs + n) +
                                       ") fails its CRC32C check; use an older checkpoint");
    }
  }
  return buffer.narrow(0, offset - begin, size);
}

at::Tensor BlockReader::read_transient(const std::string& file, int64_t offset, int64_t size) {
  const InputFile& in = open_range(file, offset, size);
  if (files_.at(file).block_bytes > 0 && verify_) return read(file, offset, size);
  if (!transient_.defined() || transient_.numel() < size) transient_ = at::empty({size}, at::kByte);
  return read_unverified(in, offset, transient_.narrow(0, 0, size));
}

void BlockReader::verify_whole(const std::string& file) {
  const InputFile& in = open(file);
  const int64_t step = std::max<int64_t>(files_.at(file).block_bytes, 1) * 64;
  for (int64_t off = 0; off < in.size(); off += step) {
    read(file, off, std::min(step, in.size() - off));
  }
  const FileInfo& info = files_.at(file);
  const int64_t blocks =
      info.block_bytes > 0 ? (in.size() + info.block_bytes - 1) / info.block_bytes : 0;
  if (static_cast<int64_t>(info.block_crc32c.size()) != blocks) {
    TDIST_THROW(CheckpointError, "checkpoint: metadata lists " +
                                     std::to_string(info.block_crc32c.size()) +
                                     " checksums for the " + std::to_string(blocks) +
                                     " blocks of '" + in.path() + "'; it is corrupt");
  }
}

}  // namespace tdist::checkpoint::detail

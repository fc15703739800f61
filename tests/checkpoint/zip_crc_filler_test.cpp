// Note [Filling zip CRCs]: LibTorch's zip writer told not to compute CRC-32s, with the filler
// between it and the bytes, writes the archive LibTorch writes computing them itself.

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "checkpoint/crc32c.h"
#include "checkpoint/torch_blob.h"
#include "checkpoint/zip_check.h"
#include "checkpoint/zip_crc_filler.h"
#include "checkpoint/zip_format.h"
#include "tdist/error.h"

namespace zip_crc_filler_test {
namespace {

using tdist::checkpoint::detail::ZipCrcFiller;

uint64_t le(const std::string& s, size_t at, int bytes) {
  return tdist::checkpoint::detail::zip::read_le(reinterpret_cast<const uint8_t*>(s.data()) + at,
                                                 bytes);
}

struct Record {
  std::string name;
  uint32_t crc;  // the data descriptor's
  std::string data;
};

/// The records from the start of an archive up to its central directory: local header, data,
/// then a data descriptor (none of these archives reaches zip64's sizes) whose size tells
/// where the data ends, or for an empty record the header alone; the next record follows.
std::vector<Record> records(const std::string& zip) {
  std::vector<Record> out;
  const size_t central = zip.find("PK\x01\x02");
  size_t at = 0;
  while (at < central && le(zip, at, 4) == 0x04034b50) {
    const size_t data = at + 30 + le(zip, at + 26, 2) + le(zip, at + 28, 2);
    if ((le(zip, at + 6, 2) & 0x8) == 0) {  // no descriptor: the header says it all
      const size_t size = le(zip, at + 18, 4);
      out.push_back({zip.substr(at + 30, le(zip, at + 26, 2)),
                     static_cast<uint32_t>(le(zip, at + 14, 4)), zip.substr(data, size)});
      at = data + size;
      continue;
    }
    // The descriptor is the first signature whose size field says how far the data came.
    size_t d = data;
    while ((d = zip.find("PK\x07\x08", d)) != std::string::npos && le(zip, d + 8, 4) != d - data)
      ++d;
    if (d == std::string::npos) break;
    out.push_back({zip.substr(at + 30, le(zip, at + 26, 2)),
                   static_cast<uint32_t>(le(zip, d + 4, 4)), zip.substr(data, d - data)});
    at = d + 16;
  }
  return out;
}

/// The calls LibTorch's writer makes for a list of `tensors`, computing CRCs or not.
std::vector<std::string> libtorch_calls(const std::vector<at::Tensor>& tensors,
                                        bool compute_crc32) {
  c10::impl::GenericList list(c10::TensorType::get());
  for (const auto& t : tensors) list.push_back(t);
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t size) { pickle.insert(pickle.end(), buf, buf + size); }, nullptr,
      nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(list);
  pickler.stop();
  std::vector<std::string> calls;
  caffe2::serialize::PyTorchStreamWriter writer(
      [&](const void* data, size_t size) {
        calls.emplace_back(static_cast<const char*>(data), size);
        return size;
      },
      compute_crc32);
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return calls;
}

std::string joined(const std::vector<std::string>& calls) {
  std::string bytes;
  for (const auto& c : calls) bytes += c;
  return bytes;
}

std::string filled(const std::vector<std::string>& calls) {
  std::string out;
  ZipCrcFiller filler(
      [&](const void* data, size_t size) { out.append(static_cast<const char*>(data), size); });
  for (const auto& c : calls) filler.write(c.data(), c.size());
  filler.finish();
  return out;
}

std::vector<at::Tensor> tensors() {
  return {at::arange(3 << 18, at::kFloat), at::empty({0}), at::tensor(7.5),
          at::randint(0, 255, {4097}, at::kByte), at::randn({33, 65}, at::kDouble)};
}

// Every record's CRC and bytes are LibTorch's own, except the serialization id LibTorch
// derives from the CRCs it computed; the archive passes the central directory's CRC check.
TEST(ZipCrcFiller, FillsTheCrcsLibTorchWouldHaveComputed) {
  const auto t = tensors();
  const std::string reference = joined(libtorch_calls(t, /*compute_crc32=*/true));
  const auto zeroed = libtorch_calls(t, /*compute_crc32=*/false);
  const auto expected = records(reference);
  ASSERT_GE(expected.size(), t.size() + 2);
  const std::string out = filled(zeroed);
  ASSERT_EQ(out.size(), reference.size());
  EXPECT_NO_THROW(tdist::checkpoint::detail::check_zip_crcs(out.data(), out.size(), "filled"));
  const auto got = records(out);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, expected[i].name);
    EXPECT_EQ(got[i].crc,
              tdist::checkpoint::detail::zip_crc32(0, got[i].data.data(), got[i].data.size()))
        << got[i].name;
    if (got[i].name.find("serialization_id") != std::string::npos) continue;
    EXPECT_EQ(got[i].crc, expected[i].crc) << got[i].name;
    EXPECT_EQ(got[i].data, expected[i].data) << got[i].name;
  }
  // The unfilled archive is what the check refuses.
  const std::string unfilled = joined(zeroed);
  EXPECT_THROW(
      tdist::checkpoint::detail::check_zip_crcs(unfilled.data(), unfilled.size(), "unfilled"),
      tdist::CheckpointError);
}

// torch_save_bytes goes through the filler and reads back equal.
TEST(ZipCrcFiller, TorchSaveBytesAreCheckedAndReadBack) {
  const at::Tensor t = at::randn({1 << 16});
  const std::string bytes = tdist::checkpoint::detail::torch_save_bytes(t);
  EXPECT_NO_THROW(tdist::checkpoint::detail::check_zip_crcs(bytes.data(), bytes.size(), "saved"));
  const auto back =
      tdist::checkpoint::detail::torch_load_bytes(bytes.data(), bytes.size(), "saved");
  EXPECT_TRUE(back.toTensor().equal(t));
}

// Bytes that are not a zip stream, a record whose CRC is already there, and an archive cut off
// inside a record are refused by name.
TEST(ZipCrcFiller, StreamsItCannotCompleteAreCheckpointErrors) {
  auto refuse = [](const std::vector<std::string>& calls, const std::string& says) {
    try {
      filled(calls);
      ADD_FAILURE() << "accepted: " << says;
    } catch (const tdist::CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refuse({std::string(64, 'x')}, "no local header");
  refuse(libtorch_calls(tensors(), /*compute_crc32=*/true), "already computed");
  auto cut = libtorch_calls(tensors(), /*compute_crc32=*/false);
  cut.resize(cut.size() / 2);
  refuse(cut, "ended inside a record");
}

}  // namespace
}  // namespace zip_crc_filler_test

// Pure unit tests: checksums, box arithmetic, metadata encoding, fault specs.

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "checkpoint/agreement.h"
#include "checkpoint/box.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/fault.h"
#include "checkpoint/file_io.h"
#include "checkpoint/metadata_codec.h"
#include "checkpoint/pickle_reader.h"
#include "checkpoint/torch_blob.h"
#include "checkpoint/zip_check.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace {

TEST(Crc32c, MatchesKnownVectors) {
  // RFC 3720 B.4 check value, and 32 zero bytes.
  EXPECT_EQ(detail::crc32c(0, "123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(detail::crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);
}

// Note [Folding CRCs]: both polynomials by every kind this CPU has (tables, SSE4.2's
// instruction, 128- and 512-bit carry-less multiplication with constants derived from the
// polynomial) against a bytewise reference over lengths and alignments around its blocks.
TEST(Crc32c, EveryKindMatchesTheBytewiseReference) {
  EXPECT_EQ(detail::zip_crc32(0, "123456789", 9), 0xCBF43926u);
  std::vector<uint8_t> data(70000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  for (const auto polynomial : {detail::CrcPolynomial::kCastagnoli, detail::CrcPolynomial::kZip}) {
    const uint32_t reflected =
        polynomial == detail::CrcPolynomial::kZip ? 0xEDB88320u : 0x82F63B78u;
    auto bytewise = [&](uint32_t crc, const uint8_t* p, size_t n) {
      crc = ~crc;
      while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ reflected : crc >> 1;
      }
      return ~crc;
    };
    const auto kinds = detail::available_crc_kinds(polynomial);
    std::cout << "CRC kinds on this CPU for polynomial " << std::hex << reflected << std::dec
              << ": " << kinds.size() << "\n";
    for (const auto kind : kinds) {
      for (size_t n : {0,   1,   15,  16,  17,  63,  64,  65,  79,  80,   127,  128,       129,
                       255, 256, 257, 271, 319, 320, 511, 512, 527, 1000, 4096, 4096 + 48, 65537}) {
        for (size_t offset : {0, 1, 7}) {
          const uint8_t* p = data.data() + offset;
          const int k = static_cast<int>(kind);
          EXPECT_EQ(detail::crc32(polynomial, 0, p, n, kind), bytewise(0, p, n))
              << n << " at +" << offset << ", kind " << k << ", polynomial " << reflected;
          EXPECT_EQ(detail::crc32(polynomial, 0xdeadbeef, p, n, kind), bytewise(0xdeadbeef, p, n))
              << n << ", kind " << k << ", polynomial " << reflected;
        }
      }
    }
  }
}

TEST(Crc32c, IncrementalEqualsOneShot) {
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 31 + 7));
  const uint32_t whole = detail::crc32c(0, data.data(), data.size());
  for (size_t cut : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    uint32_t c = detail::crc32c(0, data.data(), cut);
    c = detail::crc32c(c, data.data() + cut, data.size() - cut);
    EXPECT_EQ(c, whole) << "cut at " << cut;
  }
}

// Note [Loading in place]: the loaded tensors view the archive's bytes (no copy), equal what
// was saved, and a damaged archive is a CheckpointError.
TEST(TorchLoadInPlace, TensorsViewTheArchiveAndEqualWhatWasSaved) {
  const at::Tensor saved = at::randn({37, 11});
  const std::string archive = detail::torch_save_bytes(c10::IValue(saved));
  const at::Tensor bytes = at::empty({static_cast<int64_t>(archive.size())}, at::kByte);
  std::memcpy(bytes.data_ptr(), archive.data(), archive.size());
  const c10::IValue value = detail::torch_load_in_place(bytes, "the test archive");
  ASSERT_TRUE(value.isTensor());
  const at::Tensor loaded = value.toTensor();
  EXPECT_TRUE(loaded.equal(saved));
  const auto* begin = static_cast<const char*>(bytes.const_data_ptr());
  const auto* at = static_cast<const char*>(loaded.const_data_ptr());
  EXPECT_TRUE(at >= begin && at + loaded.nbytes() <= begin + bytes.numel())
      << "the loaded tensor is a copy, not a view of the archive";
  // The view keeps the archive's memory alive after the caller's reference is gone.
  at::Tensor kept;
  {
    at::Tensor own = bytes.clone();
    kept = detail::torch_load_in_place(own, "the test archive").toTensor();
  }
  EXPECT_TRUE(kept.equal(saved));
  // Cut short: the records' sizes no longer fit.
  const at::Tensor truncated = bytes.narrow(0, 0, bytes.numel() / 2).clone();
  EXPECT_THROW(detail::torch_load_in_place(truncated, "the cut archive"), CheckpointError);
}

TEST(BlockChecksummer, BlocksMatchDirectCrcs) {
  std::string data(300, 'x');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i);
  detail::BlockChecksummer ck(128);
  ck.update(data.data(), 100);
  ck.update(data.data() + 100, 200);
  const auto crcs = ck.finish();
  ASSERT_EQ(crcs.size(), 3u);
  EXPECT_EQ(crcs[0], detail::crc32c(0, data.data(), 128));
  EXPECT_EQ(crcs[1], detail::crc32c(0, data.data() + 128, 128));
  EXPECT_EQ(crcs[2], detail::crc32c(0, data.data() + 256, 44));
}

// Found by fuzz/zip_fuzzer.cpp: a zip64 end locator pointing near 2^64 made an offset check
// (`at + 4 > size`) wrap around, and the reader read far outside the buffer.
TEST(ZipCheck, OffsetsNearTheTopOfTheRangeAreCorruptNotAWildRead) {
  std::string archive(20 + 22, '\0');
  auto put = [&](size_t at, uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) archive[at + i] = static_cast<char>(value >> (8 * i));
  };
  put(0, 0x07064b50, 4);        // zip64 end locator...
  put(8, ~uint64_t(0) - 1, 8);  // ...whose zip64 end record is at 2^64 - 2
  put(20, 0x06054b50, 4);       // end of central directory
  put(20 + 10, 0xffff, 2);      // entries: see the zip64 record
  put(20 + 16, 0xffffffff, 4);  // central directory offset: likewise
  try {
    detail::check_zip_crcs(archive.data(), archive.size(), "crafted.pt");
    FAIL() << "accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("runs past the end"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("crafted.pt"), std::string::npos) << e.what();
  }
}

// Found by fuzz/pickle_fuzzer.cpp: a list appended to itself (Python writes one for
// `x = []; x.append(x)`) leaked, and would make every reader loop (Note [No cycles]).
// Shared values that form no cycle still read.
TEST(PickleReader, RefusesAContainerThatHoldsItselfAndReadsSharedValues) {
  const auto any = [](const std::string&) { return true; };
  const std::string self_list("\x80\x02]2a.", 6);
  try {
    detail::unpickle(self_list, any, "self.pkl");
    FAIL() << "accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("holds itself"), std::string::npos) << e.what();
  }
  // [x, x] with x = [1], as Python's pickler writes it (the second x by memo).
  const char bytes[] =
      "\x80\x02]q\x00(]q\x01"
      "K\x01"
      "ah\x01"
      "e.";
  const std::string shared(bytes, sizeof(bytes) - 1);
  const detail::PyRef value = detail::unpickle(shared, any, "shared.pkl");
  ASSERT_EQ(value->items.size(), 2u);
  EXPECT_EQ(value->items[0], value->items[1]);
  EXPECT_EQ(value->items[0]->items.at(0)->integer, 1);
}

// Found by fuzz/pickle_fuzzer.cpp: a text memo index beyond 64 bits escaped as
// std::out_of_range instead of the CheckpointError every malformed pickle raises.
TEST(PickleReader, AHugeMemoIndexIsAMalformedPickle) {
  const std::string huge = "g" + std::string(60, '5') + "\n.";
  try {
    detail::unpickle(
        huge, [](const std::string&) { return true; }, "huge.pkl");
    FAIL() << "accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
}

TEST(Box, IntersectAndRange) {
  using detail::Box;
  const Box chunk{{4, 0}, {4, 6}};   // rows 4..7 of a [10, 6] tensor
  const Box target{{6, 0}, {3, 6}};  // rows 6..8
  const Box common = detail::intersect(chunk, target);
  EXPECT_EQ(common.offsets, (std::vector<int64_t>{6, 0}));
  EXPECT_EQ(common.sizes, (std::vector<int64_t>{2, 6}));
  const auto r = detail::element_range(chunk, common);
  EXPECT_EQ(r.first, 12);  // 2 rows in
  EXPECT_EQ(r.end, 24);
  EXPECT_EQ(r.strides, (std::vector<int64_t>{6, 1}));
  EXPECT_EQ(detail::intersect(chunk, Box{{0, 0}, {4, 6}}).numel(), 0);

  // A column split: the range spans rows, the view strides pick the columns.
  const Box cols{{0, 2}, {3, 2}};
  const auto rc = detail::element_range(Box{{0, 0}, {3, 6}}, cols);
  EXPECT_EQ(rc.first, 2);
  EXPECT_EQ(rc.end, 2 * 6 + 3 + 1);

  // 0-dim: one element.
  EXPECT_EQ(Box{}.numel(), 1);
  EXPECT_EQ(detail::element_range(Box{}, Box{}).end, 1);
  EXPECT_TRUE(detail::box_within(Box{{0, 4}, {3, 2}}, {3, 6}));
  EXPECT_FALSE(detail::box_within(Box{{0, 5}, {3, 2}}, {3, 6}));
}

TEST(Base64, RoundTripsEveryLength) {
  for (size_t n = 0; n < 20; ++n) {
    std::vector<uint8_t> v;
    for (size_t i = 0; i < n; ++i) v.push_back(static_cast<uint8_t>(i * 97 + 13));
    EXPECT_EQ(detail::base64_decode(detail::base64_encode(v)), v) << n;
  }
  EXPECT_EQ(detail::base64_encode({'M', 'a', 'n'}), "TWFu");
  EXPECT_EQ(detail::base64_encode({'M'}), "TQ==");
}

CheckpointMetadata sample_metadata() {
  CheckpointMetadata m;
  m.world_size = 2;
  m.tensors["w"] = TensorInfo{"F32",
                              {4, 2},
                              {ChunkInfo{{0, 0}, {2, 2}, "shard-00000.bin", 0, 16},
                               ChunkInfo{{2, 0}, {2, 2}, "shard-00001.bin", 0, 16}}};
  m.files["shard-00000.bin"] = FileInfo{0, 16, 64, {123u}};
  m.files["shard-00001.bin"] = FileInfo{1, 16, 64, {456u}};
  ExtraState e;
  e.step = 42;
  e.data_position = 9000;
  e.rng_states["torch.cpu"] = {1, 2, 3, 250};
  e.user["lr"] = 0.25;
  m.extra_per_rank = {e, e};
  m.extra_per_rank[1].step = 43;
  return m;
}

TEST(Metadata, EncodeDecodeRoundTrip) {
  const CheckpointMetadata m = sample_metadata();
  const CheckpointMetadata d = detail::decode_metadata(detail::encode_metadata(m), "x");
  EXPECT_EQ(d.world_size, 2);
  ASSERT_EQ(d.tensors.count("w"), 1u);
  EXPECT_EQ(d.tensors.at("w").chunks[1].offsets, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(d.files.at("shard-00001.bin").block_crc32c, std::vector<uint32_t>{456u});
  ASSERT_EQ(d.extra_per_rank.size(), 2u);
  EXPECT_TRUE(d.extra_per_rank[0] == m.extra_per_rank[0]);
  EXPECT_EQ(d.extra_per_rank[1].step, 43);
}

TEST(Metadata, AnyFlippedByteIsCaught) {
  const std::string bytes = detail::encode_metadata(sample_metadata());
  int caught = 0;
  for (size_t i = 0; i < bytes.size(); i += 7) {
    std::string bad = bytes;
    bad[i] ^= 0x04;
    try {
      detail::decode_metadata(bad, "/ckpt/metadata.json");
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("/ckpt/metadata.json"), std::string::npos);
      ++caught;
    }
  }
  EXPECT_EQ(caught, static_cast<int>((bytes.size() + 6) / 7));
  EXPECT_THROW(detail::decode_metadata(bytes.substr(0, bytes.size() - 3), "m"), CheckpointError);
}

TEST(Fault, ParsesEnvironmentSpec) {
  ::setenv("TDIST_CHECKPOINT_FAULT", "2:after_write:kill", 1);
  FaultInjection f = detail::resolve_fault({});
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.phase, SavePhase::kAfterWrite);
  EXPECT_TRUE(f.kill);
  ::setenv("TDIST_CHECKPOINT_FAULT", "0:commit", 1);
  f = detail::resolve_fault({});
  EXPECT_EQ(f.phase, SavePhase::kCommit);
  EXPECT_FALSE(f.kill);
  ::setenv("TDIST_CHECKPOINT_FAULT", "0:nonsense", 1);
  EXPECT_THROW(detail::resolve_fault({}), InvalidArgument);
  ::unsetenv("TDIST_CHECKPOINT_FAULT");
  EXPECT_EQ(detail::resolve_fault({}).rank, -1);
  EXPECT_THROW(
      detail::maybe_inject(FaultInjection{1, SavePhase::kPlan, false}, 1, SavePhase::kPlan),
      CheckpointError);
  EXPECT_NO_THROW(
      detail::maybe_inject(FaultInjection{1, SavePhase::kPlan, false}, 0, SavePhase::kPlan));
}

TEST(DescribeFailures, NothingWhenEveryRankSucceeded) {
  EXPECT_EQ(detail::describe_failures({{}, {}, {}}), "");
}

TEST(DescribeFailures, RanksFailingAlikeShareOneMessage) {
  const std::string missing = "no 'metadata.json' in '/ckpt/x'";
  const std::vector<detail::Report> reports = {
      {false, missing}, {true, ""}, {false, missing}, {false, missing}};
  EXPECT_EQ(detail::describe_failures(reports), "rank(s) 0, 2, 3 failed: " + missing);
}

TEST(DescribeFailures, DifferentErrorsAreEachNamedWithTheirRanks) {
  const std::vector<detail::Report> reports = {
      {true, ""}, {false, "disk full"}, {false, "permission denied"}, {false, "disk full"}};
  EXPECT_EQ(detail::describe_failures(reports),
            "rank(s) 1, 2, 3 failed: ranks 1, 3: disk full; rank 2: permission denied");
}

}  // namespace
}  // namespace tdist::checkpoint

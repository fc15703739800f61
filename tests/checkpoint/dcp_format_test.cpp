// PyTorch's distributed checkpoint format (SaveOptions::format(kDCP)) within tdist: round
// trips resharded across world sizes and layouts, the extra state, and every way a DCP
// directory can be bad (a refused global in .metadata, a flipped byte, a missing file).
// Python's side of the format is tested in test_checkpoint_fsdp (DCPInterop).

#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>

#include "checkpoint/dcp_metadata.h"
#include "checkpoint/helpers.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/checkpoint/checkpoint.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace {

using namespace tdist::checkpoint::testing;
namespace fs = std::filesystem;

SaveOptions dcp_save(CoordinatorPtr c) {
  return SaveOptions().coordinator(std::move(c)).fsync(false).format(CheckpointFormat::kDCP);
}

using tdist::testing::error_of;

std::string saved_dcp(int seed, int world, Layout layout) {
  const auto full = reference_tensors(seed);
  const std::string dir = tdist::testing::make_temp_dir("dcp") + "/ckpt";
  run_with_coordinators(world, [&](int rank, CoordinatorPtr c) {
    ExtraState extra;
    extra.step = 50 + rank;
    save(shard_all(full, rank, world, layout, false), extra, dir, dcp_save(c));
  });
  return dir;
}

TEST(DCPFormat, LaysOutFilesAsFileSystemWriterDoes) {
  const std::string dir = saved_dcp(3, 3, Layout::kEven);
  const auto files = list_dir(dir);
  EXPECT_NE(std::find(files.begin(), files.end(), ".metadata"), files.end());
  EXPECT_NE(std::find(files.begin(), files.end(), "__0_0.distcp"), files.end());
  EXPECT_EQ(std::find(files.begin(), files.end(), kMetadataFile), files.end());
  const CheckpointMetadata m = read_metadata(dir);
  EXPECT_EQ(m.format, CheckpointFormat::kDCP);
  EXPECT_EQ(m.world_size, 3);
  EXPECT_EQ(m.tensors.size(), reference_tensors(3).size());
  EXPECT_EQ(verify(dir, true).status, CheckpointStatus::kComplete);
}

// Every (N, M) in 1..4 x 1..4, saved and loaded in different layouts, as tdist's format.
TEST(DCPFormat, ReshardsAcrossWorldSizesAndLayouts) {
  expect_reshards_every_world_pair(reference_tensors(4), dcp_save,
                                   {Layout::kUneven, Layout::kDim1, Layout::kEven, Layout::kWhole});
}

TEST(DCPFormat, ExportsWholeTensorsAndConvertsToTdistsFormat) {
  const auto full = reference_tensors(5);
  const std::string dir = saved_dcp(5, 2, Layout::kUneven);
  const TensorMap whole = read_full_tensors(dir);
  ASSERT_EQ(whole.size(), full.size());
  for (const auto& [name, t] : full) EXPECT_TRUE(bitwise_equal(whole.at(name), t)) << name;
  // And back into tdist's own format, checksummed.
  ShardedStateDict state;
  for (const auto& [name, t] : whole) state[name] = ShardedTensor::whole(t);
  const std::string tdist_dir = tdist::testing::make_temp_dir("dcp") + "/tdist";
  save(state, {}, tdist_dir, SaveOptions().fsync(false));
  EXPECT_EQ(read_metadata(tdist_dir).format, CheckpointFormat::kTdist);
  for (const auto& [name, t] : read_full_tensors(tdist_dir)) {
    EXPECT_TRUE(bitwise_equal(t, full.at(name))) << name;
  }
}

TEST(DCPFormat, ValuesConvertToTheTargetDtypeAsDcpLoadDoes) {
  // Python saves Adam's step as a float32 scalar; tdist keeps it as int64.
  const std::string dir = tdist::testing::make_temp_dir("dcp") + "/ckpt";
  ShardedStateDict saved{{"step", ShardedTensor::whole(at::scalar_tensor(7.0, at::kFloat))}};
  save(saved, {}, dir, dcp_save(std::make_shared<LocalCoordinator>()));
  ShardedStateDict target{{"step", ShardedTensor::whole(at::zeros({}, at::kLong))}};
  load(target, dir);
  EXPECT_EQ(target.at("step").local.item<int64_t>(), 7);
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(DCPFormat, AMetadataPickleNamingAnyOtherGlobalIsRefusedUnrun) {
  const std::string dir = saved_dcp(6, 1, Layout::kWhole);
  const std::string marker = tdist::testing::make_temp_dir("dcp") + "/ran";
  // os.system("touch <marker>"): what a malicious .metadata would do under pickle.load.
  const std::string command = "touch " + marker;
  std::string pickle =
      "\x80\x02"
      "cos\nsystem\n"
      "X";
  for (int i = 0; i < 4; ++i)
    pickle.push_back(static_cast<char>((command.size() >> (8 * i)) & 0xff));
  pickle += command + "\x85R.";
  write_file(dir + "/.metadata", pickle);
  const std::string error = error_of([&] { read_metadata(dir); });
  EXPECT_NE(error.find("os.system"), std::string::npos) << error;
  EXPECT_NE(error.find("not allowed"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_EQ(verify(dir).status, CheckpointStatus::kCorrupt);
}

TEST(DCPFormat, ATruncatedOrForeignMetadataIsAClearError) {
  const std::string dir = saved_dcp(7, 2, Layout::kEven);
  std::ifstream in(dir + "/.metadata", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_file(dir + "/.metadata", bytes.substr(0, bytes.size() / 2));
  std::string error = error_of([&] { read_metadata(dir); });
  EXPECT_NE(error.find("ends early"), std::string::npos) << error;
  // A valid pickle of something else: a plain dict.
  write_file(dir + "/.metadata", std::string("\x80\x02}.", 4));
  error = error_of([&] { read_metadata(dir); });
  EXPECT_NE(error.find("root object"), std::string::npos) << error;
}

// Found by fuzz/dcp_metadata_fuzzer.cpp: chunk boxes were taken as the file said, so a chunk
// outside its tensor, a negative extent or an element count past int64 reached the reader.
TEST(DCPFormat, ChunksOutsideTheirTensorAreRefused) {
  const std::string dir = saved_dcp(8, 2, Layout::kEven);
  const CheckpointMetadata saved = read_metadata(dir);
  std::string name;  // a matrix with data
  for (const auto& [n, t] : saved.tensors) {
    if (name.empty() && t.global_shape.size() == 2 && !t.chunks.empty()) name = n;
  }
  ASSERT_FALSE(name.empty());
  struct Case {
    std::function<void(TensorInfo&)> edit;
    std::string expect;
  } cases[] = {
      {[](TensorInfo& t) { t.chunks[0].offsets[0] = t.global_shape[0]; },
       "lies outside the tensor"},
      {[](TensorInfo& t) { t.chunks[0].offsets[0] = -1; }, "lies outside the tensor"},
      {[](TensorInfo& t) { t.chunks[0].sizes[0] = -2; }, "is not a valid size"},
      {[](TensorInfo& t) {
         t.global_shape = std::vector<int64_t>(t.global_shape.size(), int64_t{1} << 40);
       },
       "is not a valid size"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.expect);
    CheckpointMetadata edited = saved;
    c.edit(edited.tensors.at(name));
    write_file(dir + "/.metadata", detail::encode_dcp_metadata(edited, std::nullopt, {}, dir, "t"));
    const std::string error = error_of([&] { read_metadata(dir); });
    EXPECT_NE(error.find(c.expect), std::string::npos) << error;
  }
}

TEST(DCPFormat, AFlippedByteInADataFileIsCaughtAndNamed) {
  // Chunks of 8 KiB: the middle of each torch.save blob is tensor data, under its zip CRC.
  const std::map<std::string, at::Tensor> full{{"big", at::randn({64, 64})}};
  const std::string dir = tdist::testing::make_temp_dir("dcp") + "/ckpt";
  run_with_coordinators(2, [&](int rank, CoordinatorPtr c) {
    save(shard_all(full, rank, 2, Layout::kEven, false), {}, dir, dcp_save(c));
  });
  const ChunkInfo chunk = read_metadata(dir).tensors.at("big").chunks.at(1);
  flip_byte(dir + "/" + chunk.file, chunk.byte_offset + chunk.byte_length / 2);
  const VerifyReport report = verify(dir, true);
  EXPECT_EQ(report.status, CheckpointStatus::kCorrupt);
  EXPECT_NE(report.detail.find(chunk.file), std::string::npos) << report.detail;
  EXPECT_NE(report.detail.find("CRC-32"), std::string::npos) << report.detail;
  auto target = shard_all(full, 0, 1, Layout::kWhole, true);
  const std::string error = error_of([&] { load(target, dir); });
  EXPECT_NE(error.find(chunk.file), std::string::npos) << error;
  // Without verification the flipped value loads: that is what LoadOptions::verify is for.
  EXPECT_NO_THROW(load(target, dir, LoadOptions().verify(false)));
}

TEST(DCPFormat, AMissingDataFileIsNamed) {
  const std::string dir = saved_dcp(9, 3, Layout::kEven);
  fs::remove(dir + "/__1_0.distcp");
  const VerifyReport report = verify(dir);
  EXPECT_EQ(report.status, CheckpointStatus::kCorrupt);
  EXPECT_NE(report.detail.find("__1_0.distcp"), std::string::npos) << report.detail;
}

}  // namespace
}  // namespace tdist::checkpoint

// SafetensorsFile / SafetensorsFolder: row reads with dtype conversion, and every malformed
// file refused when opened, naming the file and the tensor.

#include <cstring>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/checkpoint/safetensors_file.h"
#include "tdist/checkpoint/sharded_safetensors.h"

using tdist::checkpoint::SafetensorsFile;
using tdist::checkpoint::SafetensorsFolder;
using tdist::testing::error_of;

namespace {

// A file with this header text and `data_bytes` bytes of data.
std::string raw_file(const std::string& dir, const std::string& name, const std::string& header,
                     size_t data_bytes) {
  const std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << std::string(data_bytes, '\0');
  return path;
}

}  // namespace

TEST(SafetensorsFile, ReadsRowRangesConvertingTheirDtype) {
  const std::string dir = tdist::testing::make_temp_dir("st-rows");
  const at::Tensor w = at::randn({7, 5}).to(at::kBFloat16);
  const at::Tensor s = at::tensor(3.5, at::kDouble);
  tdist::checkpoint::save_safetensors({{"w", w}, {"s", s}}, dir + "/model.safetensors");
  const SafetensorsFile file(dir + "/model.safetensors");
  EXPECT_EQ(file.entry("w").dtype, at::kBFloat16);
  EXPECT_EQ(file.entry("w").shape, (std::vector<int64_t>{7, 5}));
  at::Tensor rows = at::empty({3, 5});
  file.read_rows("w", 2, rows);
  EXPECT_TRUE(rows.equal(w.narrow(0, 2, 3).to(at::kFloat)));
  at::Tensor scalar = at::empty({}, at::kFloat);
  file.read_rows("s", 0, scalar);
  EXPECT_EQ(scalar.item<float>(), 3.5f);
  EXPECT_NE(error_of([&] { file.read_rows("w", 5, rows); }).find("outside its 7 rows"),
            std::string::npos);
  EXPECT_NE(error_of([&] { file.entry("nope"); }).find("has no tensor 'nope'"), std::string::npos);
}

TEST(SafetensorsFile, RefusesMalformedFilesNamingTheTensor) {
  const std::string dir = tdist::testing::make_temp_dir("st-bad");
  const std::string a = R"("a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]})";
  EXPECT_NE(error_of([&] {
              SafetensorsFile(raw_file(dir, "t.safetensors", "{" + a + "}", 10));
            }).find("ends before the data of tensor 'a'"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] {
        SafetensorsFile(raw_file(
            dir, "o.safetensors",
            "{" + a + R"(, "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", 16));
      }).find("overlapping tensors: 'a' [0, 16) and 'b' [8, 16)"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              SafetensorsFile(raw_file(
                  dir, "s.safetensors",
                  R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", 16));
            }).find("do not hold its 12 bytes"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              SafetensorsFile(raw_file(
                  dir, "d.safetensors",
                  R"({"a": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}})", 4));
            }).find("stores tensor 'a' as F8_E4M3, a dtype tdist does not load"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              SafetensorsFile(raw_file(dir, "j.safetensors", "{oops", 0));
            }).find("header that is not JSON"),
            std::string::npos);
  { std::ofstream(dir + "/short.safetensors") << "abc"; }
  EXPECT_NE(error_of([&] { SafetensorsFile(dir + "/short.safetensors"); }).find("truncated"),
            std::string::npos);
}

TEST(SafetensorsFolder, ChecksTheIndexAgainstItsShards) {
  const std::string dir = tdist::testing::make_temp_dir("st-folder");
  tdist::checkpoint::TensorMap tensors;
  for (int i = 0; i < 4; ++i) tensors["t" + std::to_string(i)] = at::full({64}, i, at::kFloat);
  tdist::checkpoint::save_safetensors_sharded(
      tensors, dir, tdist::checkpoint::ShardedSafetensorsOptions().max_shard_bytes(300));
  {
    const SafetensorsFolder folder(dir);
    EXPECT_EQ(folder.names().size(), 4u);
    EXPECT_EQ(folder.total_bytes(), 4 * 64 * 4);
    at::Tensor row = at::empty({64}, at::kDouble);
    folder.read_rows("t3", 0, row);
    EXPECT_EQ(row.sum().item<double>(), 3.0 * 64);
  }
  std::filesystem::remove(dir + "/model-00002-of-00004.safetensors");
  EXPECT_NE(error_of([&] {
              SafetensorsFolder{dir};
            }).find("names shard 'model-00002-of-00004.safetensors', which is missing"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              SafetensorsFolder{dir + "/none"};
            }).find("holds neither model.safetensors nor model.safetensors.index.json"),
            std::string::npos);
}

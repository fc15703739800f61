#include "gpt/dataset.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>

#include "tdist/error.h"
#include "tdist/models/tokenizer.h"

namespace gpt {
namespace fs = std::filesystem;
namespace {

std::string read_bytes(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  TDIST_CHECK_ARG(static_cast<bool>(in), what + ": cannot open '" + path + "'");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// FNV-1a: names a cache by what it was made from.
uint64_t fnv1a(const std::string& bytes, uint64_t hash = 1469598103934665603ULL) {
  for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ULL;
  return hash;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

DataFormat parse_data_format(const std::string& text) {
  if (text == "auto") return DataFormat::kAuto;
  if (text == "text") return DataFormat::kText;
  if (text == "uint16") return DataFormat::kUint16;
  if (text == "uint32") return DataFormat::kUint32;
  TDIST_THROW(tdist::InvalidArgument,
              "--data-format must be auto, text, uint16 or uint32, got '" + text + "'");
}

DataFormat format_of(const std::string& path, DataFormat requested) {
  if (requested != DataFormat::kAuto) return requested;
  if (ends_with(path, ".bin") || ends_with(path, ".u16")) return DataFormat::kUint16;
  if (ends_with(path, ".u32")) return DataFormat::kUint32;
  return DataFormat::kText;
}

torch::Tensor read_token_file(const std::string& path, DataFormat format, int64_t vocab_size) {
  TDIST_CHECK_ARG(format == DataFormat::kUint16 || format == DataFormat::kUint32,
                  "read_token_file: " + path + " is not a token file");
  const int64_t width = format == DataFormat::kUint16 ? 2 : 4;
  const std::string bytes = read_bytes(path, "--data");
  const auto size = static_cast<int64_t>(bytes.size());
  TDIST_CHECK_ARG(size > 0 && size % width == 0,
                  "--data " + path + ": " + std::to_string(size) +
                      " bytes is not a whole number of " + std::to_string(8 * width) +
                      "-bit token ids; is it a token file, and of this width (--data-format " +
                      (width == 2 ? "uint16" : "uint32") + ")?");
  const int64_t count = size / width;
  torch::Tensor raw = torch::empty({count}, width == 2 ? torch::kUInt16 : torch::kUInt32);
  std::memcpy(raw.data_ptr(), bytes.data(), bytes.size());
  torch::Tensor ids = raw.to(torch::kLong);
  const int64_t high = ids.max().item<int64_t>();
  if (high >= vocab_size) {
    const int64_t at = (ids >= vocab_size).nonzero().select(1, 0)[0].item<int64_t>();
    TDIST_THROW(tdist::InvalidArgument,
                "--data " + path + ": token " + std::to_string(at) + " is " +
                    std::to_string(ids[at].item<int64_t>()) +
                    ", outside the model's vocabulary [0, " + std::to_string(vocab_size) +
                    "); was the file written with this tokenizer, at this width?");
  }
  return ids;
}

std::string token_cache_path(const std::string& cache_dir, const std::string& text_path,
                             const std::string& tokenizer_path, std::optional<int64_t> eos) {
  uint64_t hash = fnv1a(read_bytes(text_path, "--data"));
  hash = fnv1a(read_bytes(tokenizer_path, "--tokenizer"), hash);
  hash = fnv1a(eos ? std::to_string(*eos) : std::string("-"), hash);
  char name[32];
  std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(hash));
  return (fs::path(cache_dir) / (fs::path(text_path).stem().string() + "." + name + ".u32"))
      .string();
}

void write_token_cache(const std::string& text_path, const tdist::models::Tokenizer& tokenizer,
                       std::optional<int64_t> eos, const std::string& cache) {
  std::vector<int64_t> ids = tokenizer.encode(read_bytes(text_path, "--data"));
  if (eos) ids.push_back(*eos);
  std::vector<uint32_t> narrow(ids.begin(), ids.end());
  fs::create_directories(fs::path(cache).parent_path());
  const std::string partial = cache + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(narrow.data()),
              static_cast<std::streamsize>(narrow.size() * sizeof(uint32_t)));
    TDIST_CHECK_ARG(static_cast<bool>(out), "token cache: cannot write " + partial);
  }
  fs::rename(partial, cache);
}

PackedLoader::PackedLoader(torch::Tensor tokens, int64_t block_size, int64_t batch_size, int rank,
                           int world_size, int64_t grad_accum, uint64_t seed, bool shuffle)
    : tokens_(std::move(tokens)),
      block_size_(block_size),
      batch_size_(batch_size),
      grad_accum_(grad_accum),
      num_sequences_((tokens_.numel() - 1) / block_size),
      rank_(rank),
      world_size_(world_size),
      seed_(seed),
      shuffle_(shuffle) {
  TDIST_CHECK_ARG(num_sequences_ >= 1, "data: " + std::to_string(tokens_.numel()) +
                                           " tokens are too few for one sequence of --block-size " +
                                           std::to_string(block_size) +
                                           "; use more data or a smaller --block-size");
  TDIST_CHECK_ARG(rank_ >= 0 && rank_ < world_size_, "PackedLoader: rank out of range");
}

int64_t PackedLoader::sequence_index(int64_t k) const {
  const int64_t epoch = k / num_sequences_, within = k % num_sequences_;
  if (!shuffle_) return within;
  if (epoch != epoch_) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 0x9E3779B97F4A7C15ULL +
                                                        static_cast<uint64_t>(epoch));
    auto perm = torch::randperm(num_sequences_, gen, torch::kLong);
    permutation_.assign(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + num_sequences_);
    epoch_ = epoch;
  }
  return permutation_[static_cast<size_t>(within)];
}

Batch PackedLoader::get(int64_t position, int64_t micro) const {
  TDIST_CHECK_ARG(micro >= 0 && micro < grad_accum_, "PackedLoader: micro-step " +
                                                         std::to_string(micro) + " outside [0, " +
                                                         std::to_string(grad_accum_) + ")");
  const int64_t first = position + (micro * world_size_ + rank_) * batch_size_;
  std::vector<torch::Tensor> rows;
  rows.reserve(static_cast<size_t>(batch_size_));
  for (int64_t i = 0; i < batch_size_; ++i) {
    const int64_t start = sequence_index(first + i) * block_size_;
    rows.push_back(tokens_.slice(0, start, start + block_size_ + 1));
  }
  const torch::Tensor windows = torch::stack(rows);
  return {windows.narrow(1, 0, block_size_).contiguous(),
          windows.narrow(1, 1, block_size_).contiguous()};
}

}  // namespace gpt

#include "gpt/corpus.h"

#include <fstream>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>

#include "gpt/tokenizer.h"
#include "tdist/error.h"

namespace gpt {

Corpus::Corpus(const std::string& path, double val_fraction, int64_t block_size) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    TDIST_THROW(tdist::InvalidArgument,
                "corpus: cannot open '" + path +
                    "'; pass --data FILE (the bundled corpus is data/kjv.txt at the project root)");
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  split(buffer.str(), val_fraction, block_size);
}

Corpus Corpus::from_text(const std::string& text, double val_fraction, int64_t block_size) {
  Corpus corpus;
  corpus.path_ = "<memory>";
  corpus.split(text, val_fraction, block_size);
  return corpus;
}

void Corpus::split(const std::string& text, double val_fraction, int64_t block_size) {
  TDIST_CHECK_ARG(val_fraction > 0.0 && val_fraction < 1.0,
                  "corpus: val_fraction must be in (0, 1), got " + std::to_string(val_fraction));
  size_bytes_ = static_cast<int64_t>(text.size());
  const auto ids = ByteTokenizer().encode(text);
  const auto n = static_cast<int64_t>(ids.size());
  const auto n_val = static_cast<int64_t>(static_cast<double>(n) * val_fraction);
  const int64_t n_train = n - n_val;
  if (n_train < block_size + 2 || n_val < block_size + 2) {
    TDIST_THROW(tdist::InvalidArgument, "corpus: '" + path_ + "' has " + std::to_string(n) +
                                            " tokens, too few for block_size " +
                                            std::to_string(block_size) + " with val_fraction " +
                                            std::to_string(val_fraction) +
                                            "; use a larger text or a smaller --block-size");
  }
  auto all = torch::tensor(ids, torch::kLong);
  train_ = all.slice(0, 0, n_train).clone();
  val_ = all.slice(0, n_train, n).clone();
}

BatchSampler::BatchSampler(torch::Tensor tokens, int64_t block_size, int64_t batch_size, int rank,
                           int world_size, uint64_t seed, int64_t grad_accum)
    : tokens_(std::move(tokens)),
      block_size_(block_size),
      batch_size_(batch_size),
      grad_accum_(grad_accum),
      rank_(rank),
      world_size_(world_size),
      seed_(seed) {
  TDIST_CHECK_ARG(tokens_.numel() > block_size_ + 1,
                  "BatchSampler: " + std::to_string(tokens_.numel()) +
                      " tokens are too few for block_size " + std::to_string(block_size_));
  TDIST_CHECK_ARG(rank_ >= 0 && rank_ < world_size_, "BatchSampler: rank out of range");
  TDIST_CHECK_ARG(grad_accum_ >= 1, "BatchSampler: grad_accum must be >= 1");
}

Batch BatchSampler::get(int64_t step, int64_t micro_step) const {
  TDIST_CHECK_ARG(micro_step >= 0 && micro_step < grad_accum_,
                  "BatchSampler: micro_step " + std::to_string(micro_step) + " outside [0, " +
                      std::to_string(grad_accum_) + ")");
  // One generator per step, identical on every rank.
  const uint64_t stream = seed_ * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(step) * 1000003ULL;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(stream);
  const int64_t max_start = tokens_.numel() - block_size_ - 1;
  auto starts = torch::randint(0, max_start + 1, {grad_accum_ * batch_size_ * world_size_}, gen,
                               torch::TensorOptions().dtype(torch::kLong));
  auto mine = starts.view({grad_accum_, batch_size_, world_size_})
                  .select(0, micro_step)
                  .select(1, rank_)
                  .contiguous();
  auto offsets = torch::arange(block_size_ + 1, torch::kLong);
  auto index = mine.unsqueeze(1) + offsets.unsqueeze(0);  // [B, T + 1]
  auto windows = tokens_.index_select(0, index.view({-1})).view({batch_size_, block_size_ + 1});
  using torch::indexing::Slice;
  return {windows.index({Slice(), Slice(0, block_size_)}).contiguous(),
          windows.index({Slice(), Slice(1, block_size_ + 1)}).contiguous()};
}

}  // namespace gpt

#pragma once

// The training data: text files tokenized once (cached beside the run), or token files
// written elsewhere (raw little-endian uint16 or uint32, as nanoGPT's train.bin), as one
// stream with EOS between documents, packed into sequences of block_size + 1 tokens, and a
// loader that gives each rank a disjoint share of every global batch.
//
// Note [The loader's position]
// Sequence k of the (endless) training stream is sequence perm_e[k mod N] of epoch
// e = k / N, perm_e a permutation drawn from (seed, e). A step reads the global batch at
// `position` (sequences consumed so far): micro-step m of rank r takes the batch_size
// sequences from position + (m * world + r) * batch_size. The position after a step is
// position + global batch; it is saved in every checkpoint, so a resumed run, at any world
// size, reads the sequences an uninterrupted one would have.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace tdist::models {
class Tokenizer;
}

namespace gpt {

/// How a data file is read: text (tokenized), or token ids of a fixed width.
enum class DataFormat { kAuto, kText, kUint16, kUint32 };
/// "auto", "text", "uint16", "uint32"; throws InvalidArgument otherwise.
DataFormat parse_data_format(const std::string& text);
/// kAuto resolved by the file's extension: .bin / .u16 uint16, .u32 uint32, else text.
DataFormat format_of(const std::string& path, DataFormat requested);

/// Token ids of a token file (int64). Throws InvalidArgument naming the file when its size
/// is not a multiple of the width, or an id is outside [0, vocab_size).
torch::Tensor read_token_file(const std::string& path, DataFormat format, int64_t vocab_size);

/// The cache file of `text_path` tokenized by the tokenizer at `tokenizer_path` with `eos`
/// after each document: a name that changes with either file's contents.
std::string token_cache_path(const std::string& cache_dir, const std::string& text_path,
                             const std::string& tokenizer_path, std::optional<int64_t> eos);
/// Tokenizes `text_path` (one document; the tokenizer's special tokens added, then `eos`)
/// into `cache` as uint32 ids (written whole under a temporary name, then renamed).
void write_token_cache(const std::string& text_path, const tdist::models::Tokenizer& tokenizer,
                       std::optional<int64_t> eos, const std::string& cache);

struct Batch {
  torch::Tensor x;  // [B, T] int64 inputs
  torch::Tensor y;  // [B, T] int64 targets (x shifted by one)
  Batch to(const torch::Device& device) const { return {x.to(device), y.to(device)}; }
};

/// Sequences of block_size + 1 tokens cut from a stream (consecutive ones share a token),
/// read as Note [The loader's position] says.
class PackedLoader {
 public:
  PackedLoader(torch::Tensor tokens, int64_t block_size, int64_t batch_size, int rank,
               int world_size, int64_t grad_accum, uint64_t seed, bool shuffle);

  int64_t num_sequences() const { return num_sequences_; }
  /// Sequences one optimizer step consumes over all ranks.
  int64_t global_batch() const { return batch_size_ * world_size_ * grad_accum_; }
  /// This rank's micro-step `micro` of the step that starts at `position`.
  Batch get(int64_t position, int64_t micro) const;

 private:
  int64_t sequence_index(int64_t k) const;
  torch::Tensor tokens_;
  int64_t block_size_, batch_size_, grad_accum_, num_sequences_;
  int rank_, world_size_;
  uint64_t seed_;
  bool shuffle_;
  mutable int64_t epoch_ = -1;
  mutable std::vector<int64_t> permutation_;
};

}  // namespace gpt

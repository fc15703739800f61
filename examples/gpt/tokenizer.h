#pragma once

// Byte-level tokenizer: every byte is one token (vocabulary 256), so any text round-trips
// exactly and nothing has to be trained or shipped.

#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

class ByteTokenizer {
 public:
  static constexpr int64_t kVocabSize = 256;

  std::vector<int64_t> encode(const std::string& text) const;
  /// Throws tdist::InvalidArgument for an id outside [0, 256).
  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t vocab_size() const { return kVocabSize; }
};

}  // namespace gpt

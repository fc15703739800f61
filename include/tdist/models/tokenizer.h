#pragma once

// Hugging Face tokenizer.json, byte-level BPE (GPT-2, Llama 3, and the models that tokenize
// like them): the added and special tokens spelled in the text, the pre-tokenizer's Unicode
// regex (PCRE2, with Unicode properties), GPT-2's byte-to-unicode mapping, the BPE merges
// by rank (ignore_merges as Llama 3 sets it), a TemplateProcessing post-processor (BOS / EOS),
// and the ByteLevel decoder. Encodes and decodes as Python's `tokenizers` does, token for
// token (tests/models/tokenizer_test.cpp).
//
// What tokenizer.json may hold is refused by name where it is not implemented (another
// model type, a normalizer other than NFC, another pre-tokenizer or post-processor, byte_fallback,
// BPE dropout), never ignored.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tdist::models {

class Tokenizer {
 public:
  /// Reads a tokenizer.json, or a SentencePiece tokenizer.model (Llama 2, Mistral; encoded
  /// by the SentencePiece library, BOS added with add_special_tokens); throws
  /// InvalidArgument naming the file and the field it does not implement.
  static Tokenizer from_file(const std::string& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /// Token ids of `text` (UTF-8); with add_special_tokens the post-processor's tokens
  /// (e.g. Llama 3's BOS) are added, as `tokenizer.encode(text).ids` does.
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const;
  /// The text of `ids`; special tokens left out when skip_special_tokens.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;
  /// Ids run from 0 to vocab_size() - 1 (the model's vocabulary and the added tokens).
  int64_t vocab_size() const;
  std::optional<int64_t> token_to_id(const std::string& token) const;

  struct State;  // what tokenizer.json holds (src/models/tokenizer.cpp)

 private:
  explicit Tokenizer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tdist::models

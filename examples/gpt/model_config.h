#pragma once

// The shape of a GPT model; no LibTorch needed to read or validate it.

#include <cstdint>
#include <string>

namespace gpt {

struct ModelConfig {
  int64_t vocab_size = 256;  ///< byte-level tokenizer: 256
  int64_t block_size = 128;  ///< context length (tokens)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  bool tie_weights = true;  ///< share the token embedding with the LM head (GPT-2 does)

  /// Throws tdist::InvalidArgument naming the bad field (e.g. n_embd not divisible by n_head).
  void validate() const;
  /// Parameter count of a model built from this config (tied weights counted once).
  int64_t num_parameters() const;
  std::string to_string() const;
};

}  // namespace gpt

#include "gpt/model_config.h"

#include <sstream>

#include "tdist/error.h"

namespace gpt {

void ModelConfig::validate() const {
  auto fail = [&](const std::string& what) {
    TDIST_THROW(tdist::InvalidArgument,
                "GPT model config: " + what + " (config: " + to_string() + ")");
  };
  if (vocab_size < 1) fail("vocab_size must be >= 1, got " + std::to_string(vocab_size));
  if (block_size < 1) fail("block_size must be >= 1, got " + std::to_string(block_size));
  if (n_layer < 1) fail("n_layer must be >= 1, got " + std::to_string(n_layer));
  if (n_head < 1) fail("n_head must be >= 1, got " + std::to_string(n_head));
  if (n_embd < 1) fail("n_embd must be >= 1, got " + std::to_string(n_embd));
  if (n_embd % n_head != 0) {
    fail("n_embd (" + std::to_string(n_embd) + ") must be divisible by n_head (" +
         std::to_string(n_head) + "); pick e.g. n_embd=" + std::to_string(n_head * 32));
  }
  if (dropout < 0.0 || dropout >= 1.0)
    fail("dropout must be in [0, 1), got " + std::to_string(dropout));
}

int64_t ModelConfig::num_parameters() const {
  const int64_t c = n_embd;
  const int64_t per_block = 2 * 2 * c              // two LayerNorms
                            + (c * 3 * c + 3 * c)  // qkv
                            + (c * c + c)          // attn proj
                            + (c * 4 * c + 4 * c)  // fc
                            + (4 * c * c + c);     // mlp proj
  int64_t total = vocab_size * c + block_size * c + n_layer * per_block + 2 * c;
  if (!tie_weights) total += vocab_size * c;
  return total;
}

std::string ModelConfig::to_string() const {
  std::ostringstream out;
  out << "vocab_size=" << vocab_size << " block_size=" << block_size << " n_layer=" << n_layer
      << " n_head=" << n_head << " n_embd=" << n_embd << " dropout=" << dropout
      << " tie_weights=" << (tie_weights ? "true" : "false");
  return out.str();
}

}  // namespace gpt

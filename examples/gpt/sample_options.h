#pragma once

// How to sample text: temperature (0: greedy), top-k, top-p, length and seed.

#include <cstdint>

namespace gpt {

struct SampleOptions {
  int64_t max_new_tokens = 200;
  double temperature = 0.8;  ///< >= 0; lower is more conservative; 0: greedy
  int64_t top_k = 40;        ///< keep the k most likely tokens; 0 keeps all
  double top_p = 1.0;        ///< keep the smallest set of tokens whose probability >= top_p
  uint64_t seed = 1234;

  void validate() const;
};

}  // namespace gpt

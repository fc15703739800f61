#pragma once

// How to sample text: temperature, top-k, length and seed.

#include <cstdint>

namespace gpt {

struct SampleOptions {
  int64_t max_new_tokens = 200;
  double temperature = 0.8;  ///< > 0; lower is more conservative
  int64_t top_k = 40;        ///< keep the k most likely tokens; 0 keeps all
  uint64_t seed = 1234;

  void validate() const;
};

}  // namespace gpt

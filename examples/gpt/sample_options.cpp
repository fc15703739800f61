#include "gpt/sample_options.h"

#include <string>

#include "tdist/error.h"

namespace gpt {

void SampleOptions::validate() const {
  TDIST_CHECK_ARG(max_new_tokens >= 0,
                  "--max-new-tokens must be >= 0, got " + std::to_string(max_new_tokens));
  TDIST_CHECK_ARG(temperature >= 0.0, "--temperature must be >= 0 (0: greedy; try 0.8), got " +
                                          std::to_string(temperature));
  TDIST_CHECK_ARG(top_p > 0.0 && top_p <= 1.0,
                  "--top-p must be in (0, 1] (1 keeps all tokens), got " + std::to_string(top_p));
  TDIST_CHECK_ARG(top_k >= 0,
                  "--top-k must be >= 0 (0 keeps all tokens), got " + std::to_string(top_k));
}

}  // namespace gpt

#pragma once

// Text from a model: the prompt encoded with the model's tokenizer (its special tokens, e.g.
// a BOS, added as the tokenizer says), continued by tdist::models::generate with the KV
// cache, and the new tokens decoded.

#include <string>

#include "gpt/sample_options.h"
#include "tdist/models/causal_lm.h"
#include "tdist/models/generation.h"
#include "tdist/models/tokenizer.h"

namespace gpt {

/// What models::generate does for `options`: greedy at temperature 0, else a seeded draw
/// after temperature, top-k and top-p; stops at the model's EOS.
tdist::models::GenerationOptions generation_options(const tdist::models::ModelConfig& config,
                                                    const SampleOptions& options);

/// Continues `prompt` and returns only the new text (special tokens left out). `forward`
/// replaces the model's own (a sharded model's collective forward: then every rank calls
/// this with the same arguments and gets the same text).
std::string generate_text(tdist::models::CausalLM& model, const tdist::models::Tokenizer& tokenizer,
                          const std::string& prompt, const SampleOptions& options,
                          const tdist::models::GenerationForward& forward = {});

}  // namespace gpt

#pragma once

// Text continuation with a KV cache, as transformers' generate() decodes: the prompt runs
// once, then each step runs the model over the one new token per sequence. Greedy by default;
// with do_sample, the logits pass transformers' warpers in its order (temperature, top-k,
// top-p) before a draw from the seeded generator.
//
//   auto out = tdist::models::generate(*model, prompt_ids,
//       tdist::models::GenerationOptions().max_new_tokens(50));        // greedy
//
// Under FSDP every forward is collective: every rank calls generate() with the same inputs
// and seed (and so draws the same tokens), passing a forward that runs the root through
// tdist::fsdp::forward.

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/arg.h"
#include "tdist/models/causal_lm.h"
#include "tdist/models/kv_cache.h"

namespace tdist::models {

struct GenerationOptions {
  /// Tokens to add to each sequence (fewer when every sequence has ended with an EOS).
  TDIST_ARG(int64_t, max_new_tokens) = 20;
  /// false: greedy (the most likely token); true: a draw after the warpers below.
  TDIST_ARG(bool, do_sample) = false;
  TDIST_ARG(double, temperature) = 1.0;  ///< > 0
  TDIST_ARG(int64_t, top_k) = 0;         ///< keep the k most likely tokens; 0: all
  TDIST_ARG(double, top_p) = 1.0;        ///< keep the smallest set whose probability >= top_p
  TDIST_ARG(uint64_t, seed) = 0;         ///< of the draws
  /// A sequence ends at any of these (empty: never); ended sequences are then padded with
  /// pad_token_id (default: the first of these), as transformers pads them.
  TDIST_ARG(std::vector<int64_t>, eos_token_ids) = {};
  TDIST_ARG(int64_t, pad_token_id) = -1;
  /// false: run the whole sequence at every step (the reference the cache is checked against).
  TDIST_ARG(bool, use_cache) = true;

 public:
  /// Throws InvalidArgument naming the bad option.
  void validate() const;
};

/// How generate() runs the model: the default calls model.forward(ids, cache); under FSDP
/// pass [&](auto& ids, auto* cache) { return tdist::fsdp::forward(model, ids, cache); }.
using GenerationForward = std::function<at::Tensor(const at::Tensor& input_ids, KVCache* cache)>;

/// input_ids [B, T] integer -> [B, T + n] int64, n <= max_new_tokens. Runs under no-grad and
/// in eval mode (restoring the model's mode). Throws InvalidArgument when T + max_new_tokens
/// passes max_position_embeddings (naming both) or an id is outside the vocabulary.
at::Tensor generate(CausalLM& model, const at::Tensor& input_ids,
                    const GenerationOptions& options = {}, const GenerationForward& forward = {});

/// The next token of each row of `logits` [B, V] under `options` (greedy or drawn).
at::Tensor next_tokens(const at::Tensor& logits, const GenerationOptions& options,
                       at::Generator& generator);

}  // namespace tdist::models

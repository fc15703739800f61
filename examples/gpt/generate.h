#pragma once

// Sampling text from a trained model: temperature, top-k, and a fixed seed that makes the
// output deterministic.

#include <cstdint>
#include <functional>
#include <string>

#include "gpt/model.h"
#include "gpt/sample_options.h"

namespace gpt {

/// Continues `prompt` (bytes) with up to max_new_tokens tokens and returns only the new text.
/// The model is put in eval mode for the call and restored after. Same model, prompt and
/// options -> same text.
/// `forward` replaces model->forward (e.g. a sharded model's collective forward: then every
/// rank must call generate with the same arguments, and every rank gets the same text).
using ForwardFn = std::function<torch::Tensor(const torch::Tensor&)>;
std::string generate(GPT& model, const std::string& prompt, const SampleOptions& options,
                     const ForwardFn& forward = nullptr);

}  // namespace gpt

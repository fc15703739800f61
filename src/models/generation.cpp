#include "tdist/models/generation.h"

#include <limits>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include "tdist/error.h"

namespace tdist::models {
namespace {

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// transformers' TopKLogitsWarper: everything below the k-th largest logit is removed.
at::Tensor top_k_filter(const at::Tensor& logits, int64_t k) {
  if (k <= 0 || k >= logits.size(-1)) return logits;
  const at::Tensor kth = std::get<0>(at::topk(logits, k, -1)).narrow(-1, k - 1, 1);
  return logits.masked_fill(logits < kth, kMinusInfinity);
}

// transformers' TopPLogitsWarper: sort ascending, remove the tokens whose cumulative
// probability stays <= 1 - top_p, always keeping the most likely one.
at::Tensor top_p_filter(const at::Tensor& logits, double top_p) {
  if (top_p >= 1.0) return logits;
  auto [sorted, order] = at::sort(logits, /*dim=*/-1, /*descending=*/false);
  const at::Tensor cumulative = sorted.softmax(-1).cumsum(-1);
  at::Tensor remove = cumulative <= (1.0 - top_p);
  remove.narrow(-1, remove.size(-1) - 1, 1).fill_(false);
  return logits.masked_fill(remove.scatter(-1, order, remove), kMinusInfinity);
}

class EvalModeGuard {
 public:
  explicit EvalModeGuard(CausalLM& model) : model_(model), was_training_(model.is_training()) {
    model_.eval();
  }
  ~EvalModeGuard() {
    if (was_training_) model_.train();
  }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  CausalLM& model_;
  bool was_training_;
};

void check_inputs(const CausalLM& model, const at::Tensor& input_ids,
                  const GenerationOptions& options) {
  options.validate();
  const auto& config = model.config();
  TDIST_CHECK_ARG(input_ids.dim() == 2 && input_ids.size(1) >= 1 &&
                      !at::isFloatingType(input_ids.scalar_type()),
                  "generate: input_ids must be an integer tensor [batch, length >= 1], got " +
                      std::string(c10::toString(input_ids.scalar_type())) + " " +
                      c10::str(input_ids.sizes()));
  const int64_t total = input_ids.size(1) + options.max_new_tokens();
  const bool extends = config.family != ModelFamily::kGPT2 && config.rope.type == "dynamic";
  TDIST_CHECK_ARG(extends || total <= config.max_position_embeddings,
                  "generate: the prompt's " + std::to_string(input_ids.size(1)) + " tokens + " +
                      std::to_string(options.max_new_tokens()) +
                      " new ones pass the model's max_position_embeddings (" +
                      std::to_string(config.max_position_embeddings) +
                      "); shorten the prompt or lower max_new_tokens");
  const auto low = input_ids.min().item<int64_t>(), high = input_ids.max().item<int64_t>();
  TDIST_CHECK_ARG(low >= 0 && high < config.vocab_size,
                  "generate: token id " + std::to_string(low < 0 ? low : high) +
                      " is outside the model's vocabulary [0, " +
                      std::to_string(config.vocab_size) +
                      "); was the prompt encoded with this model's tokenizer?");
}

}  // namespace

void GenerationOptions::validate() const {
  TDIST_CHECK_ARG(max_new_tokens_ >= 0,
                  "generate: max_new_tokens must be >= 0, got " + std::to_string(max_new_tokens_));
  TDIST_CHECK_ARG(temperature_ > 0.0,
                  "generate: temperature must be > 0, got " + std::to_string(temperature_) +
                      " (for the most likely token, sample greedily: do_sample false)");
  TDIST_CHECK_ARG(top_k_ >= 0,
                  "generate: top_k must be >= 0 (0: all), got " + std::to_string(top_k_));
  TDIST_CHECK_ARG(top_p_ > 0.0 && top_p_ <= 1.0,
                  "generate: top_p must be in (0, 1], got " + std::to_string(top_p_));
}

at::Tensor next_tokens(const at::Tensor& logits, const GenerationOptions& options,
                       at::Generator& generator) {
  const at::Tensor scores = logits.to(at::kFloat);
  if (!options.do_sample()) return scores.argmax(-1);
  at::Tensor warped = scores / options.temperature();
  warped = top_p_filter(top_k_filter(warped, options.top_k()), options.top_p());
  const at::Tensor probs = warped.softmax(-1).cpu();
  return at::multinomial(probs, 1, /*replacement=*/false, generator)
      .squeeze(-1)
      .to(logits.device());
}

at::Tensor generate(CausalLM& model, const at::Tensor& input_ids, const GenerationOptions& options,
                    const GenerationForward& forward) {
  check_inputs(model, input_ids, options);
  at::NoGradGuard no_grad;
  EvalModeGuard eval(model);
  auto run = [&](const at::Tensor& ids, KVCache* cache) {
    return forward ? forward(ids, cache) : model.forward(ids, cache);
  };
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(options.seed());
  const auto& eos = options.eos_token_ids();
  const int64_t pad = options.pad_token_id() >= 0 ? options.pad_token_id()
                      : eos.empty()               ? 0
                                                  : eos.front();
  at::Tensor sequence = input_ids.to(at::kLong);
  at::Tensor finished = at::zeros({sequence.size(0)}, sequence.options().dtype(at::kBool));
  const at::Tensor eos_ids = at::tensor(eos, at::kLong).to(sequence.device());
  KVCache cache;
  at::Tensor step_input = sequence;
  for (int64_t i = 0; i < options.max_new_tokens(); ++i) {
    const at::Tensor logits =
        options.use_cache() ? run(step_input, &cache) : run(sequence, nullptr);
    at::Tensor next = next_tokens(logits.select(1, logits.size(1) - 1), options, generator);
    next = at::where(finished, at::full_like(next, pad), next);
    sequence = at::cat({sequence, next.unsqueeze(1)}, 1);
    step_input = next.unsqueeze(1);
    if (eos.empty()) continue;
    finished = finished.logical_or(at::isin(next, eos_ids));
    if (finished.all().item<bool>()) break;
  }
  return sequence;
}

}  // namespace tdist::models

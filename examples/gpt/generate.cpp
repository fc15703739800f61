#include "gpt/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include "gpt/tokenizer.h"
#include "tdist/error.h"

namespace gpt {

std::string generate(GPT& model, const std::string& prompt, const SampleOptions& options,
                     const ForwardFn& forward) {
  options.validate();
  ByteTokenizer tokenizer;
  const auto& config = model->config();
  auto ids = tokenizer.encode(prompt.empty() ? std::string("\n") : prompt);
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const auto device = model->wte->weight.device();

  std::vector<int64_t> out;
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const auto n = static_cast<int64_t>(ids.size());
    const int64_t start = std::max<int64_t>(0, n - config.block_size);
    std::vector<int64_t> window(ids.begin() + start, ids.end());
    auto idx = torch::tensor(window, torch::kLong).to(device).unsqueeze(0);
    auto logits = (forward ? forward(idx) : model->forward(idx))
                      .select(1, idx.size(1) - 1)
                      .squeeze(0)
                      .to(torch::kFloat);
    logits = logits / options.temperature;
    if (options.top_k > 0 && options.top_k < logits.size(0)) {
      auto kth = std::get<0>(torch::topk(logits, options.top_k)).min();
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
    }
    auto probs = torch::softmax(logits, -1).cpu();
    const int64_t next = torch::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
    ids.push_back(next);
    out.push_back(next);
  }
  if (was_training) model->train();
  return tokenizer.decode(out);
}

}  // namespace gpt

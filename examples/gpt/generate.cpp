#include "gpt/generate.h"

#include <ATen/ATen.h>

namespace gpt {

tdist::models::GenerationOptions generation_options(const tdist::models::ModelConfig& config,
                                                    const SampleOptions& options) {
  options.validate();
  auto generation = tdist::models::GenerationOptions()
                        .max_new_tokens(options.max_new_tokens)
                        .seed(options.seed)
                        .eos_token_ids(config.eos_token_ids);
  if (config.pad_token_id) generation.pad_token_id(*config.pad_token_id);
  if (options.temperature > 0.0) {
    generation.do_sample(true)
        .temperature(options.temperature)
        .top_k(options.top_k)
        .top_p(options.top_p);
  }
  return generation;
}

std::string generate_text(tdist::models::CausalLM& model, const tdist::models::Tokenizer& tokenizer,
                          const std::string& prompt, const SampleOptions& options,
                          const tdist::models::GenerationForward& forward) {
  const auto ids = tokenizer.encode(prompt);
  const auto device = model.parameters().front().device();
  const at::Tensor input = at::tensor(ids, at::kLong).view({1, -1}).to(device);
  const at::Tensor out =
      tdist::models::generate(model, input, generation_options(model.config(), options), forward);
  const at::Tensor fresh =
      out.select(0, 0).narrow(0, input.size(1), out.size(1) - input.size(1)).cpu();
  std::vector<int64_t> new_ids(fresh.data_ptr<int64_t>(),
                               fresh.data_ptr<int64_t>() + fresh.numel());
  return tokenizer.decode(new_ids, /*skip_special_tokens=*/true);
}

}  // namespace gpt

#include <cmath>

#include <ATen/ATen.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "tdist/detail/util/text.h"
#include "tdist/error.h"
#include "tdist/models/gpt2.h"
#include "tdist/models/llama.h"
#include "tdist/models/pretrained.h"

namespace tdist::models {

std::shared_ptr<CausalLM> build_model(const ModelConfig& config) {
  if (config.family == ModelFamily::kGPT2) return std::make_shared<GPT2LMHeadModel>(config);
  return std::make_shared<LlamaForCausalLM>(config);
}

fsdp::ModuleInitFn init_weights_fn(const ModelConfig& config) {
  const double std_dev = config.initializer_range;
  const double residual_std =
      std_dev / std::sqrt(2.0 * static_cast<double>(config.num_hidden_layers));
  const bool gpt2 = config.family == ModelFamily::kGPT2;
  return [=](const std::string& name, torch::nn::Module& module) {
    at::NoGradGuard no_grad;
    if (auto* norm = module.as<RMSNormImpl>()) {
      norm->weight.fill_(1.0);
    } else if (auto* ln = module.as<torch::nn::LayerNormImpl>()) {
      ln->weight.fill_(1.0);
      ln->bias.zero_();
    } else if (auto* linear = module.as<torch::nn::LinearImpl>()) {
      linear->weight.normal_(0.0, std_dev);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* embedding = module.as<torch::nn::EmbeddingImpl>()) {
      embedding->weight.normal_(0.0, std_dev);
      if (auto pad = embedding->options.padding_idx()) embedding->weight[*pad].zero_();
    } else if (auto* conv = module.as<Conv1DImpl>()) {
      // GPT-2's residual projections, scaled for the depth of the residual stream.
      conv->weight.normal_(0.0, gpt2 && util::ends_with(name, "c_proj") ? residual_std : std_dev);
      conv->bias.zero_();
    } else if (!module.named_parameters(/*recurse=*/false).is_empty()) {
      TDIST_THROW(InvalidArgument, "init_weights_fn: module '" + name + "' (" + module.name() +
                                       ") holds parameters of a kind it does not initialise");
    }
  };
}

void fully_shard_model(const std::shared_ptr<CausalLM>& model,
                       const fsdp::FullyShardOptions& options) {
  TDIST_CHECK_ARG(model != nullptr, "fully_shard_model: model is null");
  for (const auto& layer : model->layers()) fsdp::fully_shard(layer, options);
  fsdp::fully_shard(std::static_pointer_cast<torch::nn::Module>(model), options);
}

}  // namespace tdist::models

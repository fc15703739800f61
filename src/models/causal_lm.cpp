#include "tdist/models/causal_lm.h"

#include <ATen/ATen.h>

#include "tdist/error.h"
#include "tdist/tensor/parallel/parallelize.h"

namespace tdist::models {
namespace {

// Losses are taken in float32 (as transformers' upcast) or in a wider dtype the model has.
at::ScalarType loss_dtype(const at::Tensor& logits) {
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Mean cross-entropy of logits [..., V] against integer targets [...], positions whose target
// is -100 left out, as transformers' loss.
at::Tensor token_cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(loss_dtype(logits)),
                                targets.reshape({-1}).to(at::kLong).to(logits.device()),
                                /*weight=*/{}, at::Reduction::Mean, /*ignore_index=*/-100);
}

}  // namespace

CausalLM::CausalLM(const std::string& name, ModelConfig config)
    : torch::nn::Module(name), config_(std::move(config)) {
  config_.validate();
}

at::Tensor CausalLM::forward(const at::Tensor& input_ids, KVCache* cache) {
  check_input_ids(input_ids, cache != nullptr ? cache->length() : 0);
  return logits(input_ids, cache);
}

at::Tensor CausalLM::next_token_loss(const at::Tensor& input_ids, const at::Tensor& targets) {
  check_input_ids(input_ids, 0);
  TDIST_CHECK_ARG(
      targets.sizes() == input_ids.sizes() && !at::isFloatingType(targets.scalar_type()),
      "next_token_loss: targets " + std::string(c10::toString(targets.scalar_type())) + " " +
          c10::str(targets.sizes()) + " for input_ids " + c10::str(input_ids.sizes()) +
          "; give the integer token that follows each input position");
  const at::Tensor flat_targets = targets.reshape({-1}).to(at::kLong);
  if (const auto sharded = vocab_parallel_logits(input_ids)) {
    const at::Tensor local = sharded->to_local();
    const at::Tensor rows = local.reshape({-1, local.size(-1)}).to(loss_dtype(local));
    const tensor::DTensor logits =
        tensor::DTensor::from_local(rows, sharded->device_mesh(), {tensor::Shard(1)},
                                    tensor::FromLocalOptions().shape(std::vector<int64_t>{
                                        rows.size(0), sharded->shape().back()}));
    return tensor::parallel::loss_parallel_cross_entropy(logits, flat_targets.to(rows.device()));
  }
  return token_cross_entropy(logits(input_ids, nullptr), flat_targets);
}

void CausalLM::check_input_ids(const at::Tensor& input_ids, int64_t cached) const {
  TDIST_CHECK_ARG(input_ids.dim() == 2 && !at::isFloatingType(input_ids.scalar_type()),
                  "models: input_ids must be an integer tensor [batch, sequence], got " +
                      std::string(c10::toString(input_ids.scalar_type())) + " " +
                      c10::str(input_ids.sizes()));
  const int64_t length = cached + input_ids.size(1);
  const bool extends = config_.family != ModelFamily::kGPT2 && config_.rope.type == "dynamic";
  TDIST_CHECK_ARG(length <= config_.max_position_embeddings || extends,
                  "models: a sequence of " + std::to_string(length) +
                      (cached > 0 ? " tokens (" + std::to_string(cached) + " cached)" : " tokens") +
                      " is longer than the model's max_position_embeddings (" +
                      std::to_string(config_.max_position_embeddings) +
                      "); split or crop the input");
}

LayerContext CausalLM::layer_context(KVCache* cache) const {
  LayerContext context;
  context.cache = cache;
  context.past = cache != nullptr ? cache->length() : 0;
  context.num_layers = config_.num_hidden_layers;
  return context;
}

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels) {
  TDIST_CHECK_ARG(logits.dim() == 3 && labels.dim() == 2 && logits.size(0) == labels.size(0) &&
                      logits.size(1) == labels.size(1),
                  "causal_lm_loss: logits " + c10::str(logits.sizes()) + " and labels " +
                      c10::str(labels.sizes()) + " must be [B, T, V] and [B, T]");
  const int64_t length = logits.size(1);
  return token_cross_entropy(logits.narrow(1, 0, length - 1), labels.narrow(1, 1, length - 1));
}

at::Tensor next_token_targets(const at::Tensor& input_ids) {
  TDIST_CHECK_ARG(input_ids.dim() == 2,
                  "next_token_targets: input_ids must be [batch, sequence], got " +
                      c10::str(input_ids.sizes()));
  at::Tensor targets = at::full_like(input_ids, -100);
  const int64_t length = input_ids.size(1);
  targets.narrow(1, 0, length - 1).copy_(input_ids.narrow(1, 1, length - 1));
  return targets;
}

}  // namespace tdist::models

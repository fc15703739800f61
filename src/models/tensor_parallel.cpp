#include "tdist/models/tensor_parallel.h"

#include "tdist/error.h"
#include "tdist/tensor/parallel/parallelize.h"

namespace tdist::models {

using tensor::Placement;
using tensor::Replicate;
using tensor::Shard;
using tensor::parallel::ColwiseParallel;
using tensor::parallel::ParallelizePlan;
using tensor::parallel::PrepareModuleInput;
using tensor::parallel::PrepareModuleOutput;
using tensor::parallel::RowwiseParallel;
using tensor::parallel::SequenceParallel;

ParallelizePlan tensor_parallel_plan(const ModelConfig& config,
                                     const TensorParallelOptions& options) {
  const bool sp = options.sequence_parallel();
  // Between the blocks: a sequence shard with sequence parallelism, else the whole tensor.
  const Placement between = sp ? Placement(Shard(1)) : Placement(Replicate());
  ParallelizePlan plan{
      {"model.layers.*.self_attn.q_proj", ColwiseParallel()},
      {"model.layers.*.self_attn.k_proj", ColwiseParallel()},
      {"model.layers.*.self_attn.v_proj", ColwiseParallel()},
      {"model.layers.*.self_attn.o_proj", RowwiseParallel().output_layouts(between)},
      {"model.layers.*.mlp.gate_proj", ColwiseParallel()},
      {"model.layers.*.mlp.up_proj", ColwiseParallel()},
      {"model.layers.*.mlp.down_proj", RowwiseParallel().output_layouts(between)},
  };
  if (sp) {
    for (const char* norm : {"model.layers.*.input_layernorm",
                             "model.layers.*.post_attention_layernorm", "model.norm"}) {
      plan.emplace(norm, SequenceParallel());
    }
    // Each block gathers its input once for its column-parallel projections and reduces
    // their gradients once (torchtitan's PrepareModuleInput with DTensor inputs).
    for (const char* block : {"model.layers.*.self_attn", "model.layers.*.mlp"}) {
      plan.emplace(block, PrepareModuleInput()
                              .input_layouts(Shard(1))
                              .desired_input_layouts(Replicate())
                              .use_local_output(false));
    }
  }
  if (config.tie_word_embeddings) {
    // A tied head multiplies by the embedding's weight directly; both stay whole then.
    if (sp) {
      plan.emplace(
          "model.embed_tokens",
          PrepareModuleOutput().output_layouts(Replicate()).desired_output_layouts(Shard(1)));
    }
    return plan;
  }
  const bool lp = options.loss_parallel();
  plan.emplace("model.embed_tokens",
               RowwiseParallel().input_layouts(Replicate()).output_layouts(between));
  plan.emplace("lm_head", ColwiseParallel()
                              .input_layouts(between)
                              .output_layouts(lp ? Placement(Shard(-1)) : Placement(Replicate()))
                              .use_local_output(!lp));
  return plan;
}

void apply_tensor_parallel(const std::shared_ptr<CausalLM>& model, const mesh::DeviceMesh& tp_mesh,
                           const TensorParallelOptions& options) {
  const ModelConfig& c = model->config();
  TDIST_CHECK_ARG(c.family != ModelFamily::kGPT2,
                  "apply_tensor_parallel: GPT-2's attention projects q, k and v in one fused "
                  "c_attn, which column shards would split across q/k/v rather than by heads; "
                  "tensor parallelism is provided for the Llama, Mistral and Qwen2 families");
  const int64_t size = tp_mesh.ndim() == 1 ? tp_mesh.size() : 0;
  TDIST_CHECK_ARG(
      size > 0 && c.num_attention_heads % size == 0 && c.num_key_value_heads % size == 0,
      "apply_tensor_parallel: " + std::to_string(c.num_attention_heads) + " attention heads and " +
          std::to_string(c.num_key_value_heads) + " key/value heads over " + tp_mesh.to_string() +
          "; each rank takes whole heads, so a 1-D mesh whose size divides both is "
          "needed");
  tensor::parallel::parallelize_module(model, tp_mesh, tensor_parallel_plan(c, options));
}

}  // namespace tdist::models

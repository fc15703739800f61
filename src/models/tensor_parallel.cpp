#include "tdist/models/tensor_parallel.h"

#include "tdist/error.h"
#include "tdist/tensor/parallel/parallelize.h"

namespace tdist::models {

using tensor::Replicate;
using tensor::parallel::ColwiseParallel;
using tensor::parallel::ParallelizePlan;
using tensor::parallel::RowwiseParallel;

ParallelizePlan tensor_parallel_plan(const ModelConfig& config) {
  ParallelizePlan plan{
      {"model.layers.*.self_attn.q_proj", ColwiseParallel()},
      {"model.layers.*.self_attn.k_proj", ColwiseParallel()},
      {"model.layers.*.self_attn.v_proj", ColwiseParallel()},
      {"model.layers.*.self_attn.o_proj", RowwiseParallel()},
      {"model.layers.*.mlp.gate_proj", ColwiseParallel()},
      {"model.layers.*.mlp.up_proj", ColwiseParallel()},
      {"model.layers.*.mlp.down_proj", RowwiseParallel()},
  };
  // A tied head multiplies by the embedding's weight directly; both stay whole then.
  if (!config.tie_word_embeddings) {
    plan.emplace("model.embed_tokens", RowwiseParallel().input_layouts(Replicate()));
    plan.emplace("lm_head", ColwiseParallel().output_layouts(Replicate()));
  }
  return plan;
}

void apply_tensor_parallel(const std::shared_ptr<CausalLM>& model,
                           const mesh::DeviceMesh& tp_mesh) {
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
  tensor::parallel::parallelize_module(model, tp_mesh, tensor_parallel_plan(c));
}

}  // namespace tdist::models

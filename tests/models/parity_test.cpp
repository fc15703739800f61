// Each family against transformers itself: logits of tiny random models it made, loaded
// whole and into FSDP shards, and one training step against PyTorch FSDP2.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "oracle.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/detail/fsdp/shard_layout.h"
#include "tdist/fsdp/forward.h"
#include "tdist/models/pretrained.h"

namespace models = tdist::models;
using tdist::testing::env_str;
using tdist::testing::oracle_model;
using tdist::testing::relative_error;
using tdist::testing::tensor_from;
using tdist::testing::transformers_unavailable;

namespace {

const std::vector<std::string> kFp32Cases = {
    "llama_gqa_llama3", "llama_tied_linear", "llama_dynamic_long",  "mistral_window",
    "qwen2_window",     "gpt2_small",        "gpt2_untied_sharded", "llama_bf16_sharded"};

at::Tensor inputs_of(const std::string& dir) {
  return tensor_from(dir + "/inputs.safetensors", "input_ids");
}

}  // namespace

class FamilyParity : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyParity, LogitsEqualTransformersInFloat32) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  const std::string dir = oracle_model(GetParam());
  auto model = models::from_pretrained(dir, models::LoadOptions().dtype(at::kFloat));
  torch::NoGradGuard no_grad;
  const at::Tensor logits = model->forward(inputs_of(dir));
  const at::Tensor expected = tensor_from(dir + "/expected.safetensors", "logits_fp32");
  ASSERT_EQ(logits.sizes(), expected.sizes());
  EXPECT_LE(relative_error(logits, expected), 1e-5) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Cases, FamilyParity, ::testing::ValuesIn(kFp32Cases));

TEST(FamilyParityBf16, LogitsEqualTransformersWithinBf16Rounding) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  const std::string dir = oracle_model("llama_bf16_sharded");
  auto model = models::from_pretrained(dir);  // the config's dtype: bfloat16
  EXPECT_EQ(model->parameters()[0].scalar_type(), at::kBFloat16);
  torch::NoGradGuard no_grad;
  const at::Tensor logits = model->forward(inputs_of(dir));
  EXPECT_EQ(logits.scalar_type(), at::kBFloat16);
  const at::Tensor expected = tensor_from(dir + "/expected.safetensors", "logits");
  // bf16 keeps 8 significant bits: a few units of 2^-8 after two layers.
  EXPECT_LE(relative_error(logits.to(at::kFloat), expected), 2e-2);
  EXPECT_GT(relative_error(logits.to(at::kFloat),
                           tensor_from(dir + "/expected.safetensors", "logits_fp32")),
            0.0);
}

// Loaded straight into shards at this world size: the logits of the whole model.
TDIST_SCENARIO(models_sharded_logits) {
  tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("MODEL_DIR");
  auto model =
      models::from_pretrained(dir, models::LoadOptions().dtype(at::kFloat).fully_shard(true));
  const auto whole = models::build_model(model->config())->named_parameters();
  for (const auto& item : model->named_parameters()) {
    const auto layout = tdist::fsdp::ShardLayout::compute(
        whole[item.key()].sizes().vec(), tdist::get_world_size(), tdist::get_rank());
    EXPECT_EQ(item.value().size(0), layout.local_rows) << item.key() << " is not this rank's shard";
  }
  torch::NoGradGuard no_grad;
  const at::Tensor logits = tdist::fsdp::forward(model, inputs_of(dir));
  const at::Tensor expected = tensor_from(dir + "/expected.safetensors", "logits_fp32");
  EXPECT_LE(relative_error(logits, expected), 1e-5);
  tdist::destroy_process_group();
}

TEST(ShardedLoad, EachFamilyLoadedIntoShardsAtThreeGivesTransformersLogits) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  for (const char* name : {"llama_gqa_llama3", "qwen2_window", "gpt2_untied_sharded"}) {
    tdist::testing::ProcessOptions options;
    options.env = {{"MODEL_DIR", oracle_model(name)}};
    SCOPED_TRACE(name);
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("models_sharded_logits", 3, options));
  }
}

// One training step under tdist's FSDP, rank r on input row r, against PyTorch FSDP2's
// loss and gradients (fsdp2_step.safetensors).
TDIST_SCENARIO(models_fsdp_step) {
  tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("MODEL_DIR");
  const int rank = tdist::get_rank();
  auto model =
      models::from_pretrained(dir, models::LoadOptions().dtype(at::kFloat).fully_shard(true));
  model->train();
  const at::Tensor ids = inputs_of(dir).narrow(0, rank, 1);
  const at::Tensor loss = models::causal_lm_loss(tdist::fsdp::forward(model, ids), ids);
  loss.backward();
  const std::string ref = dir + "/fsdp2_step.safetensors";
  EXPECT_LE(
      relative_error(loss.detach().reshape({1}), tensor_from(ref, "losses").narrow(0, rank, 1)),
      1e-6);
  int compared = 0;
  for (const auto& item : model->named_parameters()) {
    const at::Tensor full = tensor_from(ref, "grad." + item.key());
    const auto layout =
        tdist::fsdp::ShardLayout::compute(full.sizes().vec(), tdist::get_world_size(), rank);
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    const at::Tensor want =
        full.reshape({layout.dim0, -1}).narrow(0, layout.row_offset, layout.local_rows);
    EXPECT_LE(relative_error(item.value().grad().reshape({layout.local_rows, -1}), want), 1e-5)
        << item.key();
    ++compared;
  }
  EXPECT_GT(compared, 10);
  tdist::destroy_process_group();
}

TEST(FSDPStepParity, LossAndGradientsEqualPyTorchFSDP2AtTwo) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  for (const char* name : {"llama_gqa_llama3", "mistral_window", "qwen2_window", "gpt2_small"}) {
    SCOPED_TRACE(name);
    const std::string dir = oracle_model(name);
    tdist::testing::run_oracle({"fsdp2_step", dir, "2"});
    tdist::testing::ProcessOptions options;
    options.env = {{"MODEL_DIR", dir}};
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("models_fsdp_step", 2, options));
  }
}

// Loaded into shards with FSDP's bf16 mixed precision (float32 masters, bfloat16 compute,
// float32 reduction), as the trainer runs: the logits of the float32 model within bf16's
// rounding, and a backward that leaves float32 gradients on the float32 shards.
TDIST_SCENARIO(models_mixed_precision) {
  tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("MODEL_DIR");
  const auto policy =
      tdist::fsdp::MixedPrecisionPolicy().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat);
  auto model = models::from_pretrained(
      dir, models::LoadOptions()
               .dtype(at::kFloat)
               .fully_shard(true)
               .fsdp_options(tdist::fsdp::FullyShardOptions().mp_policy(policy)));
  const at::Tensor ids = inputs_of(dir);
  const at::Tensor logits = tdist::fsdp::forward(model, ids);
  EXPECT_EQ(logits.scalar_type(), at::kBFloat16);
  EXPECT_LE(relative_error(logits.to(at::kFloat),
                           tensor_from(dir + "/expected.safetensors", "logits_fp32")),
            3e-2);
  models::causal_lm_loss(logits, ids).backward();
  for (const auto& p : model->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.scalar_type(), at::kFloat);
    EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
  }
  tdist::destroy_process_group();
}

TEST(ShardedLoad, Bf16MixedPrecisionAtTwo) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  tdist::testing::ProcessOptions options;
  options.env = {{"MODEL_DIR", oracle_model("llama_gqa_llama3")}};
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("models_mixed_precision", 2, options));
}

// No oracle needed on the GPU machine: the same folder on the GPU and on the CPU.
TEST(ModelsOnCuda, LoadsOntoTheGpuAndComputesWhatTheCpuDoes) {
  if (!tdist::testing::has_gpu()) GTEST_SKIP() << "no GPU: LibTorch sees no CUDA device";
  const std::string dir = tdist::testing::make_temp_dir("hf-cuda") + "/model";
  const auto config = models::ModelConfig::from_json(
      R"({"model_type": "qwen2", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "use_sliding_window": true, "sliding_window": 5, "max_window_layers": 1})");
  torch::manual_seed(5);
  models::save_pretrained(*models::build_model(config), dir);
  auto cpu = models::from_pretrained(dir);
  auto gpu = models::from_pretrained(dir, models::LoadOptions().device(at::Device(at::kCUDA, 0)));
  EXPECT_TRUE(gpu->parameters()[0].is_cuda());
  const at::Tensor ids = at::randint(0, 97, {2, 16}, at::kLong);
  torch::NoGradGuard no_grad;
  EXPECT_LE(relative_error(gpu->forward(ids.cuda()).cpu(), cpu->forward(ids)), 1e-4);
}

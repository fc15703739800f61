// Fine-tuning under FSDP, exporting from the shards, and transformers reloading the export.

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "oracle.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/checkpoint/safetensors_file.h"
#include "tdist/comm/distributed.h"
#include "tdist/fsdp/forward.h"
#include "tdist/models/pretrained.h"

namespace fs = std::filesystem;
namespace models = tdist::models;
using tdist::testing::env_str;
using tdist::testing::oracle_model;
using tdist::testing::relative_error;
using tdist::testing::tensor_from;
using tdist::testing::transformers_unavailable;

namespace {

// Every parameter of `model`, whole, and its eval logits on `ids`, from rank 0 into `file`
// (collective); in `dtype` when given (no logits then).
void save_reference(const std::shared_ptr<models::CausalLM>& model, const at::Tensor& ids,
                    const std::string& file, std::optional<c10::ScalarType> dtype) {
  tdist::checkpoint::TensorMap ref;
  for (auto& [name, t] : tdist::checkpoint::module_tensors(*model)) {
    ref[name] = dtype ? t.to(*dtype) : t;
  }
  if (!dtype) {
    model->eval();
    torch::NoGradGuard no_grad;
    ref["logits"] = tdist::fsdp::forward(model, ids).contiguous();
    model->train();
  }
  if (tdist::get_rank() == 0) tdist::checkpoint::save_safetensors(ref, file);
  tdist::barrier();
}

}  // namespace

// Three AdamW steps at this world size (rank r on input row r % 2), then exports in float32
// and bfloat16 beside the references save_reference writes.
TDIST_SCENARIO(models_finetune_export) {
  tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("MODEL_DIR"), out = env_str("OUT_DIR");
  auto model =
      models::from_pretrained(dir, models::LoadOptions().dtype(at::kFloat).fully_shard(true));
  model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  const at::Tensor ids = tensor_from(dir + "/inputs.safetensors", "input_ids");
  const at::Tensor mine = ids.narrow(0, tdist::get_rank() % 2, 1);
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    models::causal_lm_loss(tdist::fsdp::forward(model, mine), mine).backward();
    opt.step();
  }
  const auto files = models::save_pretrained(
      *model, out + "/export", models::SaveOptions().files_from(dir).max_shard_bytes(30000));
  EXPECT_FALSE(files.empty());
  save_reference(model, ids, out + "/ref.safetensors", std::nullopt);
  models::save_pretrained(*model, out + "/export_bf16", models::SaveOptions().dtype(at::kBFloat16));
  save_reference(model, ids, out + "/ref_bf16.safetensors", at::kBFloat16);
  tdist::destroy_process_group();
}

TEST(Export, FinetunedAtThreeTransformersReloadsEveryParameterBitwise) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  for (const char* name : {"llama_gqa_llama3", "qwen2_window", "gpt2_small"}) {
    SCOPED_TRACE(name);
    const std::string dir = oracle_model(name);
    const std::string out = tdist::testing::make_temp_dir("hf-export");
    tdist::testing::ProcessOptions options;
    options.env = {{"MODEL_DIR", dir}, {"OUT_DIR", out}};
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("models_finetune_export", 3, options));
    // No staging folder left behind; the files transformers needs are there.
    EXPECT_FALSE(fs::exists(out + "/export.tdist-partial"));
    EXPECT_TRUE(fs::exists(out + "/export/config.json"));
    EXPECT_TRUE(fs::exists(out + "/export/generation_config.json"));
    EXPECT_TRUE(fs::exists(out + "/export/model.safetensors.index.json"))
        << "max_shard_bytes 30000 splits every test model";
    fs::copy_file(dir + "/inputs.safetensors", out + "/export/inputs.safetensors");
    const std::string checked =
        tdist::testing::run_oracle({"check_export", out + "/export", out + "/ref.safetensors"});
    EXPECT_NE(checked.find("parameters bitwise"), std::string::npos) << checked;
    fs::copy_file(dir + "/inputs.safetensors", out + "/export_bf16/inputs.safetensors");
    tdist::testing::run_oracle(
        {"check_export", out + "/export_bf16", out + "/ref_bf16.safetensors"});
    // tdist reads its own export back, whole, with the logits it had.
    auto reloaded = models::from_pretrained(out + "/export");
    torch::NoGradGuard no_grad;
    EXPECT_LE(
        relative_error(reloaded->forward(tensor_from(dir + "/inputs.safetensors", "input_ids")),
                       tensor_from(out + "/ref.safetensors", "logits")),
        1e-5);
  }
}

TEST(Export, ReplacesAnEarlierExportOnlyWhenComplete) {
  const std::string out = tdist::testing::make_temp_dir("hf-replace");
  models::ModelConfig config = models::ModelConfig::from_json(
      R"({"model_type": "gpt2", "n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 8,
          "vocab_size": 20})");
  torch::manual_seed(3);
  auto model = models::build_model(config);
  models::save_pretrained(*model, out + "/m");
  const auto before = tdist::checkpoint::load_safetensors(out + "/m/model.safetensors");
  auto other = models::build_model(config);
  const std::string error = tdist::testing::error_of([&] {
    models::save_pretrained(*other, out + "/m", models::SaveOptions().dtype(at::kComplexFloat));
  });
  EXPECT_NE(error.find("cannot save dtype ComplexFloat"), std::string::npos) << error;
  const auto after = tdist::checkpoint::load_safetensors(out + "/m/model.safetensors");
  EXPECT_TRUE(after.at("transformer.wte.weight").equal(before.at("transformer.wte.weight")));
  EXPECT_FALSE(fs::exists(out + "/m.tdist-partial"));
  models::save_pretrained(*other, out + "/m");
  const auto replaced = tdist::checkpoint::load_safetensors(out + "/m/model.safetensors");
  EXPECT_TRUE(replaced.at("transformer.wte.weight")
                  .equal(other->named_parameters()["transformer.wte.weight"]));
  EXPECT_FALSE(fs::exists(out + "/m.tdist-old"));
  // A folder that cannot be made: an error, and nothing written.
  { std::ofstream(out + "/file") << "x"; }
  EXPECT_NE(tdist::testing::error_of([&] {
              models::save_pretrained(*model, out + "/file/sub");
            }).find("save_pretrained: creating the files failed"),
            std::string::npos);
}

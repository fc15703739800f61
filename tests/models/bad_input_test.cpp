// Model folders that are not what they claim: each refused with an error naming the file,
// the tensor or the field, before anything is loaded.

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "oracle.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/models/pretrained.h"

namespace fs = std::filesystem;
namespace models = tdist::models;
using tdist::testing::error_of;
using tdist::testing::oracle_model;
using tdist::testing::transformers_unavailable;

namespace {

std::string copy_of(const std::string& dir) {
  const std::string copy = tdist::testing::make_temp_dir("hf-bad") + "/model";
  fs::copy(dir, copy, fs::copy_options::recursive);
  return copy;
}

void replace_in_file(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << path;
  text.replace(at, from.size(), to);
  std::ofstream(path) << text;
}

std::string load_error(const std::string& dir) {
  return error_of([&] { models::from_pretrained(dir); });
}

}  // namespace

TEST(BadModelFolder, MissingOrTruncatedShardIsNamed) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  const std::string missing = copy_of(oracle_model("gpt2_untied_sharded"));
  fs::remove(missing + "/model-00003-of-00008.safetensors");
  EXPECT_NE(
      load_error(missing).find("names shard 'model-00003-of-00008.safetensors', which is missing"),
      std::string::npos)
      << load_error(missing);
  const std::string truncated = copy_of(oracle_model("gpt2_untied_sharded"));
  const std::string shard = truncated + "/model-00002-of-00008.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  const std::string error = load_error(truncated);
  EXPECT_NE(error.find("model-00002-of-00008.safetensors' ends before the data of tensor"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("truncated?"), std::string::npos) << error;
}

TEST(BadModelFolder, ShapeAgainstTheConfigIsNamedWithItsFields) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  const std::string dir = copy_of(oracle_model("llama_gqa_llama3"));
  replace_in_file(dir + "/config.json", "\"intermediate_size\": 96", "\"intermediate_size\": 80");
  const std::string error = load_error(dir);
  EXPECT_NE(error.find("tensor 'model.layers.0.mlp.gate_proj.weight'"), std::string::npos) << error;
  EXPECT_NE(error.find("has shape [96, 64], but config.json"), std::string::npos) << error;
  EXPECT_NE(error.find("intermediate_size 80"), std::string::npos) << error;
  EXPECT_NE(error.find("makes it [80, 64]"), std::string::npos) << error;
}

TEST(BadModelFolder, MissingAndExtraTensorsAreNamed) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  const std::string dir = copy_of(oracle_model("gpt2_small"));
  const std::string file = dir + "/model.safetensors";
  auto tensors = tdist::checkpoint::load_safetensors(file);
  tensors.erase("transformer.h.1.ln_2.bias");
  tdist::checkpoint::save_safetensors(tensors, file);
  EXPECT_NE(load_error(dir).find("lack 'transformer.h.1.ln_2.bias'"), std::string::npos)
      << load_error(dir);
  tensors = tdist::checkpoint::load_safetensors(oracle_model("gpt2_small") + "/model.safetensors");
  tensors["transformer.h.2.attn.c_attn.weight"] = at::zeros({48, 144});
  tdist::checkpoint::save_safetensors(tensors, file);
  EXPECT_NE(
      load_error(dir).find("holds tensor 'transformer.h.2.attn.c_attn.weight', which is not a "
                           "parameter of the GPT2LMHeadModel"),
      std::string::npos)
      << load_error(dir);
}

TEST(BadModelFolder, BaseModelFilesWithoutThePrefixLoad) {
  // The original GPT-2 files name tensors as GPT2Model does ("h.0.attn.c_attn.weight").
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  const std::string dir = copy_of(oracle_model("gpt2_small"));
  tdist::checkpoint::TensorMap bare;
  for (auto& [name, t] : tdist::checkpoint::load_safetensors(dir + "/model.safetensors")) {
    bare[name.substr(std::string("transformer.").size())] = t;
  }
  bare["h.0.attn.bias"] = at::ones({1, 1, 32, 32});  // the causal-mask buffer old files saved
  tdist::checkpoint::save_safetensors(bare, dir + "/model.safetensors");
  auto model = models::from_pretrained(dir);
  torch::NoGradGuard no_grad;
  const at::Tensor ids = tdist::testing::tensor_from(dir + "/inputs.safetensors", "input_ids");
  EXPECT_LE(tdist::testing::relative_error(
                model->forward(ids),
                tdist::testing::tensor_from(dir + "/expected.safetensors", "logits_fp32")),
            1e-5);
}

TEST(BadModelFolder, NotAModelAndTooLongAreRefused) {
  EXPECT_NE(load_error(tdist::testing::make_temp_dir("hf-empty")).find("has no config.json"),
            std::string::npos);
  models::ModelConfig config = models::ModelConfig::from_json(
      R"({"model_type": "llama", "vocab_size": 11, "hidden_size": 8, "intermediate_size": 8,
          "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 6})");
  auto model = models::build_model(config);
  EXPECT_NE(
      error_of([&] {
        model->forward(at::zeros({1, 7}, at::kLong));
      }).find("a sequence of 7 tokens is longer than the model's max_position_embeddings (6)"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              model->forward(at::zeros({1, 3}));
            }).find("must be an integer tensor"),
            std::string::npos);
}

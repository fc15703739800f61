// ModelConfig: what config.json gives, and every field it refuses, by name.

#include <gtest/gtest.h>

#include "support/expect.h"
#include "tdist/models/config.h"
#include "tdist/models/rotary.h"

using tdist::models::ModelConfig;
using tdist::models::ModelFamily;
using tdist::testing::error_of;

namespace {

const char* kLlama = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100,
  "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 24,
  "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "attention_bias": true,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
  "rope_theta": 500000.0, "torch_dtype": "bfloat16", "pretraining_tp": 1,
  "eos_token_id": [128001, 128009], "use_cache": true, "_name_or_path": "x"})";

std::string with(const std::string& base, const std::string& key, const std::string& value) {
  // Appends "key": value: of two equal keys in JSON text, the parser keeps the last.
  return base.substr(0, base.rfind('}')) + ", \"" + key + "\": " + value + "}";
}

}  // namespace

TEST(ModelConfig, ReadsLlama3FieldsAndLegacySpellings) {
  const ModelConfig c = ModelConfig::from_json(kLlama);
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 24);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.dtype, c10::kBFloat16);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128009}));
  EXPECT_EQ(c.sliding_windows, (std::vector<int64_t>{0, 0}));
}

TEST(ModelConfig, WritesWhatItReadsBack) {
  const ModelConfig c = ModelConfig::from_json(kLlama);
  const ModelConfig again = ModelConfig::from_json(c.to_json());
  EXPECT_EQ(again.to_json(), c.to_json());
  EXPECT_EQ(again.rope.factor, 8.0);
  EXPECT_EQ(again.head_dim, 24);
  EXPECT_EQ(again.num_parameters(), c.num_parameters());
  // 100*64 embed + 100*64 head + 64 norm + 2 layers of (2*64 norms + q 64*96+96, k and v
  // 64*24+24 each, o 96*64+64, gate/up/down 3*64*96)
  const int64_t layer = 2 * 64 + (64 * 96 + 96) + 2 * (64 * 24 + 24) + (96 * 64 + 64) + 3 * 64 * 96;
  EXPECT_EQ(c.num_parameters(), 100 * 64 * 2 + 64 + 2 * layer);
}

TEST(ModelConfig, Qwen2SlidingLayersFollowMaxWindowLayersOrLayerTypes) {
  const std::string base = R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
    "intermediate_size": 8, "num_hidden_layers": 3, "num_attention_heads": 2,
    "use_sliding_window": true, "sliding_window": 4, "max_window_layers": 1})";
  EXPECT_EQ(ModelConfig::from_json(base).sliding_windows, (std::vector<int64_t>{0, 4, 4}));
  EXPECT_EQ(
      ModelConfig::from_json(
          with(base, "layer_types", R"(["sliding_attention", "full_attention", "full_attention"])"))
          .sliding_windows,
      (std::vector<int64_t>{4, 0, 0}));
  EXPECT_EQ(ModelConfig::from_json(with(base, "use_sliding_window", "false")).sliding_windows,
            (std::vector<int64_t>{0, 0, 0}));
  EXPECT_TRUE(ModelConfig::from_json(base).qkv_bias);
}

TEST(ModelConfig, AcceptsTheHubsQwen25Config) {
  // Qwen2.5-0.5B's config.json as the Hub ships it.
  const std::string qwen = R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
    "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
    "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
    "use_mrope": false, "use_sliding_window": false, "vocab_size": 151936})";
  const ModelConfig c = ModelConfig::from_json(qwen);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope.theta, 1000000.0);
  EXPECT_EQ(c.sliding_windows, std::vector<int64_t>(24, 0));
  EXPECT_NEAR(static_cast<double>(c.num_parameters()), 494032768.0, 1.0);
  EXPECT_NE(error_of([&] {
              ModelConfig::from_json(with(qwen, "use_mrope", "true"));
            }).find("field 'use_mrope' is true"),
            std::string::npos);
}

TEST(ModelConfig, Gpt2ReadsItsOwnNames) {
  const ModelConfig c = ModelConfig::from_json(
      R"({"model_type": "gpt2", "n_embd": 48, "n_layer": 3, "n_head": 4, "n_positions": 32,
          "vocab_size": 99, "n_ctx": 32, "summary_type": "cls_index"})");
  EXPECT_EQ(c.family, ModelFamily::kGPT2);
  EXPECT_EQ(c.hidden_size, 48);
  EXPECT_EQ(c.intermediate_size, 4 * 48);
  EXPECT_EQ(c.max_position_embeddings, 32);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.hidden_act, "gelu_new");
}

TEST(ModelConfig, RefusesWhatItDoesNotImplementByName) {
  EXPECT_NE(error_of([] {
              ModelConfig::from_json(with(kLlama, "model_type", "\"falcon\""));
            }).find("field 'model_type' is 'falcon'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ModelConfig::from_json(
                  with(kLlama, "architectures", "[\"LlamaForSequenceClassification\"]"));
            }).find("field 'architectures'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ModelConfig::from_json(
                  with(kLlama, "rope_scaling", R"({"rope_type": "yarn", "factor": 2.0})"));
            }).find("field 'rope_scaling.rope_type' is 'yarn'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ModelConfig::from_json(with(kLlama, "quantization_config", R"({"bits": 4})"));
            }).find("field 'quantization_config' is not known"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ModelConfig::from_json(with(kLlama, "hidden_act", "\"gelu_fast\""));
            }).find("field 'hidden_act' is 'gelu_fast'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ModelConfig::from_json(with(kLlama, "torch_dtype", "\"float8_e4m3fn\""));
            }).find("field 'torch_dtype'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ModelConfig::from_json(R"({"model_type": "llama", "vocab_size": 10})");
            }).find("field 'hidden_size' is missing"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ModelConfig::from_json(with(kLlama, "num_key_value_heads", "3"));
            }).find("num_key_value_heads (3)"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ModelConfig::from_json(R"({"model_type": "gpt2", "add_cross_attention": true})");
            }).find("field 'add_cross_attention'"),
            std::string::npos);
  EXPECT_NE(error_of([] { ModelConfig::from_json("{not json"); }).find("is not JSON"),
            std::string::npos);
  // Found by fuzz/model_config_fuzzer.cpp: a negative or absurd layer count sized a per-layer
  // table before validation (std::length_error / bad_alloc, not an error naming the field).
  EXPECT_NE(error_of([] {
              ModelConfig::from_json(with(kLlama, "num_hidden_layers", "-1"));
            }).find("field 'num_hidden_layers' is -1"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ModelConfig::from_json(R"({"model_type": "gpt2", "n_layer": 1000000000000})");
            }).find("field 'n_layer' is 1000000000000"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { ModelConfig::load("/nonexistent-model-dir"); }).find("has no config.json"),
      std::string::npos);
}

TEST(Rotary, DynamicMatchesDefaultUpToMaxPositionsAndGrowsPastThem) {
  ModelConfig c = ModelConfig::from_json(kLlama);
  c.rope = tdist::models::RopeConfig();
  const at::Tensor base = tdist::models::rope_inverse_frequencies(c, 10);
  c.rope.type = "dynamic";
  c.rope.factor = 2.0;
  EXPECT_TRUE(tdist::models::rope_inverse_frequencies(c, c.max_position_embeddings).equal(base));
  const at::Tensor longer =
      tdist::models::rope_inverse_frequencies(c, 2 * c.max_position_embeddings);
  EXPECT_TRUE(longer.lt(base).narrow(0, 1, base.size(0) - 1).all().item<bool>());
}

// generate() with the KV cache against transformers' generate(), and the cache against the
// whole-sequence forward it replaces.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "oracle.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/fsdp/forward.h"
#include "tdist/models/generation.h"
#include "tdist/models/pretrained.h"

namespace models = tdist::models;
using tdist::testing::env_str;
using tdist::testing::error_of;
using tdist::testing::oracle_model;
using tdist::testing::relative_error;
using tdist::testing::tensor_from;
using tdist::testing::transformers_unavailable;

namespace {

constexpr int64_t kPrompt = 4;  // as hf_oracle.py's PROMPT, GENERATE
constexpr int64_t kNew = 10;

const std::vector<std::string> kCases = {
    "llama_gqa_llama3", "llama_tied_linear", "llama_dynamic_long", "mistral_window",
    "qwen2_window",     "gpt2_small",        "gpt2_untied_sharded"};

at::Tensor prompt_of(const std::string& dir) {
  return tensor_from(dir + "/inputs.safetensors", "input_ids").narrow(1, 0, kPrompt);
}

models::GenerationOptions greedy(const models::CausalLM& model) {
  const auto& c = model.config();
  return models::GenerationOptions()
      .max_new_tokens(kNew)
      .eos_token_ids(c.eos_token_ids)
      .pad_token_id(c.pad_token_id.value_or(0));
}

}  // namespace

class GenerationParity : public ::testing::TestWithParam<std::string> {};

TEST_P(GenerationParity, GreedyTokensEqualTransformersGenerate) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  const std::string dir = oracle_model(GetParam());
  auto model = models::from_pretrained(dir, models::LoadOptions().dtype(at::kFloat));
  const at::Tensor expected = tensor_from(dir + "/generated.safetensors", "generated");
  const at::Tensor cached = models::generate(*model, prompt_of(dir), greedy(*model));
  ASSERT_EQ(cached.sizes(), expected.sizes()) << cached << expected;
  EXPECT_TRUE(cached.equal(expected)) << "tdist\n" << cached << "\ntransformers\n" << expected;
  const at::Tensor uncached =
      models::generate(*model, prompt_of(dir), greedy(*model).use_cache(false));
  EXPECT_TRUE(uncached.equal(cached));
}

INSTANTIATE_TEST_SUITE_P(Cases, GenerationParity, ::testing::ValuesIn(kCases));

// Every position of a prompt-then-one-token-at-a-time pass equals the whole-sequence forward.
TEST(KVCache, CachedLogitsEqualTheWholeSequenceForward) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  for (const char* name : {"mistral_window", "qwen2_window", "gpt2_small", "llama_gqa_llama3"}) {
    SCOPED_TRACE(name);
    const std::string dir = oracle_model(name);
    auto model = models::from_pretrained(dir, models::LoadOptions().dtype(at::kFloat));
    torch::NoGradGuard no_grad;
    const at::Tensor ids = tensor_from(dir + "/inputs.safetensors", "input_ids");
    const at::Tensor whole = model->forward(ids);
    models::KVCache cache;
    std::vector<at::Tensor> parts;
    parts.push_back(model->forward(ids.narrow(1, 0, 5), &cache));
    EXPECT_EQ(cache.length(), 5);
    parts.push_back(model->forward(ids.narrow(1, 5, 3), &cache));  // several at once
    for (int64_t t = 8; t < ids.size(1); ++t) {
      parts.push_back(model->forward(ids.narrow(1, t, 1), &cache));
    }
    EXPECT_EQ(cache.length(), ids.size(1));
    EXPECT_LE(relative_error(at::cat(parts, 1), whole), 1e-5);
  }
}

TEST(Sampling, WarpersFollowTransformers) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor logits = at::tensor({1.0f, 3.0f, 2.0f, 0.5f}).view({1, 4});
  auto sample = models::GenerationOptions().do_sample(true);
  // top-k 1 and a tiny top-p keep only the most likely token.
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(models::next_tokens(logits, models::GenerationOptions(sample).top_k(1), gen)
                  .item<int64_t>(),
              1);
    EXPECT_EQ(models::next_tokens(logits, models::GenerationOptions(sample).top_p(0.1), gen)
                  .item<int64_t>(),
              1);
  }
  // top-k 2 never draws the two least likely; top-p 0.9 (softmax 0.09 0.67 0.24 0.05:
  // the smallest set reaching 0.9 is {1, 2, 0}) never draws token 3.
  for (int i = 0; i < 200; ++i) {
    const auto k2 = models::next_tokens(logits, models::GenerationOptions(sample).top_k(2), gen)
                        .item<int64_t>();
    EXPECT_TRUE(k2 == 1 || k2 == 2) << k2;
    EXPECT_NE(models::next_tokens(logits, models::GenerationOptions(sample).top_p(0.9), gen)
                  .item<int64_t>(),
              3);
  }
  // Greedy is argmax; the same seed draws the same tokens.
  EXPECT_EQ(models::next_tokens(logits, models::GenerationOptions(), gen).item<int64_t>(), 1);
  auto a = at::make_generator<at::CPUGeneratorImpl>(3),
       b = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor wide = at::randn({4, 50});
  EXPECT_TRUE(models::next_tokens(wide, sample, a).equal(models::next_tokens(wide, sample, b)));
}

TEST(Generation, BadOptionsAndInputsAreRefusedByName) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  auto model = models::from_pretrained(oracle_model("gpt2_untied_sharded"),
                                       models::LoadOptions().dtype(at::kFloat));
  const at::Tensor prompt = at::zeros({1, 4}, at::kLong);
  auto error = [&](auto fn) { return error_of(fn); };
  using ::testing::HasSubstr;
  EXPECT_THAT(
      error([&] { models::generate(*model, prompt, models::GenerationOptions().temperature(0)); }),
      HasSubstr("temperature must be > 0"));
  EXPECT_THAT(
      error([&] { models::generate(*model, prompt, models::GenerationOptions().top_p(0)); }),
      HasSubstr("top_p must be in (0, 1]"));
  // n_positions 16: 4 + 13 passes it.
  EXPECT_THAT(error([&] {
                models::generate(*model, prompt, models::GenerationOptions().max_new_tokens(13));
              }),
              HasSubstr("max_position_embeddings (16)"));
  EXPECT_THAT(error([&] {
                models::generate(*model, at::full({1, 2}, 64, at::kLong),
                                 models::GenerationOptions().max_new_tokens(5));
              }),
              HasSubstr("outside the model's vocabulary [0, 64)"));
  // A cache may not carry the sequence past max_position_embeddings either.
  models::KVCache cache;
  torch::NoGradGuard no_grad;
  model->forward(at::zeros({1, 16}, at::kLong), &cache);
  EXPECT_THAT(error([&] {
                model->forward(at::zeros({1, 1}, at::kLong), &cache);
              }),
              HasSubstr("(16 cached)"));
}

// Sharded at three ranks, every rank generating in lockstep through fsdp::forward: the
// tokens transformers generates.
TDIST_SCENARIO(models_sharded_generate) {
  tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("MODEL_DIR");
  auto model =
      models::from_pretrained(dir, models::LoadOptions().dtype(at::kFloat).fully_shard(true));
  const at::Tensor out = models::generate(*model, prompt_of(dir), greedy(*model),
                                          [&](const at::Tensor& ids, models::KVCache* cache) {
                                            return tdist::fsdp::forward(model, ids, cache);
                                          });
  EXPECT_TRUE(out.equal(tensor_from(dir + "/generated.safetensors", "generated")));
  tdist::destroy_process_group();
}

TEST(GenerationParity, ShardedAtThreeInLockstep) {
  if (!transformers_unavailable().empty()) GTEST_SKIP() << transformers_unavailable();
  tdist::testing::ProcessOptions options;
  options.env = {{"MODEL_DIR", oracle_model("qwen2_window")}};
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("models_sharded_generate", 3, options));
}

// FSDP state dicts (tdist/fsdp/state_dict.h), end to end at world 1-4 with real processes:
// full and sharded model + optimizer state dicts round-trip, and loading them into a fresh
// model and optimizer resumes training bitwise; uneven shapes (7 rows over 3 and 4 ranks),
// every supported optimizer, mixed precision, frozen and ignored parameters, rank0_only +
// cpu_offload, and strict errors naming the key.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "fsdp/tiny_transformer.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/state_dict.h"

namespace tdist::fsdp {
namespace {

using testing::TinyConfig;
using testing::TinyTransformer;

constexpr int64_t kLocalBatch = 2;
constexpr int kTrainSteps = 3;

using tdist::testing::env_str;

TinyConfig config_from_env() {
  return env_str("SD_SHAPES", "uneven") == "uneven" ? testing::uneven_tiny_config() : TinyConfig();
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                        std::vector<torch::Tensor> params) {
  namespace o = torch::optim;
  if (kind == "sgd") {
    return std::make_unique<o::SGD>(params, o::SGDOptions(1e-2).momentum(0.9));
  } else if (kind == "adam") {
    return std::make_unique<o::Adam>(params, o::AdamOptions(1e-3).amsgrad(true));
  } else if (kind == "adagrad") {
    return std::make_unique<o::Adagrad>(params, o::AdagradOptions(1e-2));
  } else if (kind == "rmsprop") {
    return std::make_unique<o::RMSprop>(params,
                                        o::RMSpropOptions(1e-3).momentum(0.5).centered(true));
  }
  return std::make_unique<o::AdamW>(params, o::AdamWOptions(1e-3).weight_decay(0.01));
}

/// A sharded tiny transformer, configured by SD_VARIANT: "" | "mp" (bf16 compute) |
/// "frozen" (tok frozen) | "ignored" (head.bias ignored by FSDP).
struct Setup {
  TinyTransformer model{nullptr};
  std::unique_ptr<torch::optim::Optimizer> opt;
};

Setup make_setup(const TinyConfig& c, uint64_t seed) {
  const std::string variant = env_str("SD_VARIANT", "");
  Setup s;
  s.model = testing::make_tiny(c, seed);
  s.model->register_buffer("scale", torch::arange(3, torch::kFloat) + static_cast<double>(seed));
  if (variant == "frozen") s.model->tok->weight.set_requires_grad(false);
  FullyShardOptions opts;
  if (variant == "mp") opts.mp_policy(MixedPrecisionPolicy().param_dtype(torch::kBFloat16));
  if (variant == "ignored") opts.ignored_params({s.model->head->bias});
  for (auto& block : s.model->blocks) fully_shard(block, opts);
  fully_shard(s.model, opts);
  std::vector<torch::Tensor> trainable;
  for (const auto& p : s.model->parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  s.opt = make_optimizer(env_str("SD_OPT", "adamw"), trainable);
  return s;
}

/// One training step on this rank's part of the global batch; returns the global mean loss.
double train_step(Setup& s, const TinyConfig& c, int step) {
  const int world = get_world_size(), rank = get_rank();
  auto [inputs, targets] = testing::tiny_batch(c, kLocalBatch * world, step);
  auto x = inputs.narrow(0, rank * kLocalBatch, kLocalBatch);
  auto y = targets.narrow(0, rank * kLocalBatch, kLocalBatch);
  s.opt->zero_grad();
  auto loss = testing::lm_loss(tdist::fsdp::forward(s.model, x), y);
  loss.backward();
  s.opt->step();
  auto global = torch::tensor({loss.item<double>()}, torch::kFloat64);
  all_reduce(global);
  return global.item<double>() / world;
}

ShardedStateDict deep_copy(const ShardedStateDict& in) {
  ShardedStateDict out;
  for (const auto& [name, st] : in) out[name] = {st.local.clone(), st.global_shape, st.offsets};
  return out;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && a.equal(b);
}

void expect_same(const ShardedStateDict& a, const ShardedStateDict& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, st] : a) {
    auto it = b.find(name);
    ASSERT_NE(it, b.end()) << what << ": " << name;
    EXPECT_EQ(st.global_shape, it->second.global_shape) << what << ": " << name;
    EXPECT_EQ(st.offsets, it->second.offsets) << what << ": " << name;
    EXPECT_TRUE(bitwise_equal(st.local, it->second.local)) << what << ": " << name;
  }
}

// Train, take state dicts, train on (losses L1, L2); load them into a fresh model and
// optimizer, train the same steps: the same losses and parameters, bitwise.
void run_resume() {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank();
  const TinyConfig c = config_from_env();
  const bool full = env_str("SD_FULL", "0") == "1";
  const std::string variant = env_str("SD_VARIANT", "");
  const StateDictOptions options = StateDictOptions().full_state_dict(full);

  // The names and shapes of the unsharded model, for reference.
  TinyTransformer plain = testing::make_tiny(c);
  plain->register_buffer("scale", torch::zeros({3}));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : plain->named_parameters())
    shapes[item.key()] = item.value().sizes().vec();
  for (const auto& item : plain->named_buffers()) shapes[item.key()] = item.value().sizes().vec();

  Setup a = make_setup(c, 1234);
  for (int step = 0; step < kTrainSteps; ++step) train_step(a, c, step);
  const ShardedStateDict model_sd = deep_copy(get_model_state_dict(*a.model, options));
  const ShardedStateDict optim_sd = deep_copy(get_optimizer_state_dict(*a.model, *a.opt, options));

  // Contents: the unsharded model's names and global shapes, fp32 (master) data.
  ASSERT_EQ(model_sd.size(), shapes.size());
  for (const auto& [name, shape] : shapes) {
    ASSERT_EQ(model_sd.count(name), 1u) << name;
    const ShardedTensor& st = model_sd.at(name);
    EXPECT_EQ(st.global_shape, shape) << name;
    EXPECT_EQ(st.local.scalar_type(), torch::kFloat) << name;
    if (full) {
      EXPECT_EQ(st.local.sizes().vec(), shape) << name;
    }
  }
  if (variant == "frozen") {
    EXPECT_EQ(optim_sd.count("tok.weight.exp_avg"), 0u);  // not in the optimizer
  } else {
    ASSERT_GT(optim_sd.size(), 0u);
  }
  for (const auto& [name, st] : optim_sd) {
    const auto dot = name.rfind('.');
    const std::string param = name.substr(0, dot);
    ASSERT_EQ(shapes.count(param), 1u) << name;
    if (name.substr(dot + 1) != "step") {
      EXPECT_EQ(st.global_shape, shapes.at(param)) << name;
    }
  }
  if (!full) {
    // The sharded slices are the rows of the full tensors (gathered here for comparison).
    const ShardedStateDict whole =
        get_model_state_dict(*a.model, StateDictOptions().full_state_dict(true));
    for (const auto& [name, st] : model_sd) {
      at::Tensor expected = whole.at(name).local;
      if (!st.offsets.empty()) expected = expected.narrow(0, st.offsets[0], st.local.size(0));
      EXPECT_TRUE(bitwise_equal(st.local, expected)) << "rank " << rank << " " << name;
    }
    if (variant == "ignored") {
      EXPECT_EQ(model_sd.at("head.bias").local.sizes().vec(), shapes.at("head.bias"));
    }
  }

  const double l1 = train_step(a, c, kTrainSteps);
  const double l2 = train_step(a, c, kTrainSteps + 1);
  const ShardedStateDict a_after =
      get_model_state_dict(*a.model, StateDictOptions().full_state_dict(true));

  Setup b = make_setup(c, 999);  // different weights, optimizer without state
  set_model_state_dict(*b.model, model_sd, options);
  set_optimizer_state_dict(*b.model, *b.opt, optim_sd, options);
  expect_same(get_model_state_dict(*b.model, options), model_sd, "model after load");
  expect_same(get_optimizer_state_dict(*b.model, *b.opt, options), optim_sd,
              "optimizer after load");
  EXPECT_EQ(train_step(b, c, kTrainSteps), l1) << "rank " << rank;
  EXPECT_EQ(train_step(b, c, kTrainSteps + 1), l2) << "rank " << rank;
  expect_same(get_model_state_dict(*b.model, StateDictOptions().full_state_dict(true)), a_after,
              "model two steps after load");
  destroy_process_group();
}

TDIST_SCENARIO(sd_resume) {
  run_resume();
}

// rank0_only + cpu_offload full state dicts, loading them back with rank0_only, and strict
// errors naming the key (with rank0_only every rank raises, none hangs).
TDIST_SCENARIO(sd_rank0) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank();
  const TinyConfig c = config_from_env();
  Setup a = make_setup(c, 1234);
  for (int step = 0; step < 2; ++step) train_step(a, c, step);
  const auto r0 = StateDictOptions().full_state_dict(true).rank0_only(true).cpu_offload(true);
  const ShardedStateDict model_sd = get_model_state_dict(*a.model, r0);
  const ShardedStateDict optim_sd = get_optimizer_state_dict(*a.model, *a.opt, r0);
  const auto all = StateDictOptions().full_state_dict(true);
  const ShardedStateDict model_all = get_model_state_dict(*a.model, all);
  const ShardedStateDict optim_all = get_optimizer_state_dict(*a.model, *a.opt, all);
  if (rank == 0) {
    expect_same(model_sd, model_all, "rank0_only model");
    expect_same(optim_sd, optim_all, "rank0_only optimizer");
    for (const auto& [name, st] : model_sd) {
      EXPECT_TRUE(st.local.device().is_cpu()) << name;
      for (const auto& p : a.model->parameters()) {
        EXPECT_FALSE(st.local.is_alias_of(p)) << name << " aliases a live parameter";
      }
    }
  } else {
    EXPECT_TRUE(model_sd.empty());
    EXPECT_TRUE(optim_sd.empty());
  }

  Setup b = make_setup(c, 999);
  set_model_state_dict(*b.model, model_sd, r0);  // empty on ranks > 0: broadcast from 0
  set_optimizer_state_dict(*b.model, *b.opt, optim_sd, r0);
  expect_same(get_model_state_dict(*b.model, all), model_all, "model loaded rank0_only");
  expect_same(get_optimizer_state_dict(*b.model, *b.opt, all), optim_all,
              "optimizer loaded rank0_only");

  // strict: the error names the missing / unexpected key.
  const std::string key = "block0.fc1.weight";
  auto expect_error_naming = [&](const std::function<void()>& fn, const std::string& name,
                                 const std::string& what) {
    try {
      fn();
      ADD_FAILURE() << what << ": no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << what << ": " << e.what();
    }
  };
  ShardedStateDict missing = model_all;
  missing.erase(key);
  expect_error_naming([&] { set_model_state_dict(*b.model, missing, all); }, key, "full");
  ShardedStateDict sharded = get_model_state_dict(*b.model);
  sharded.erase(key);
  expect_error_naming([&] { set_model_state_dict(*b.model, sharded); }, key, "sharded");
  ShardedStateDict r0_missing = model_sd;  // rank 0's dict lacks it: every rank raises
  r0_missing.erase(key);
  expect_error_naming([&] { set_model_state_dict(*b.model, r0_missing, r0); }, key, "rank0");
  ShardedStateDict bogus = optim_all;
  bogus["no.such.param.exp_avg"] = ShardedTensor::whole(torch::zeros({1}));
  expect_error_naming([&] { set_optimizer_state_dict(*b.model, *b.opt, bogus, all); },
                      "no.such.param.exp_avg", "optimizer");
  // Non-strict loads what matches.
  set_model_state_dict(*b.model, missing, StateDictOptions().full_state_dict(true).strict(false));
  destroy_process_group();
}

struct Case {
  const char* name;
  const char* scenario;
  int world;
  std::map<std::string, std::string> env;
};

class StateDict : public ::testing::TestWithParam<Case> {};

TEST_P(StateDict, Resumes) {
  const Case& p = GetParam();
  tdist::testing::ProcessOptions options;
  options.env = p.env;
  options.timeout = std::chrono::seconds(120);
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes(p.scenario, p.world, options));
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, StateDict,
    ::testing::Values(
        Case{"sharded_w1", "sd_resume", 1, {}}, Case{"full_w1", "sd_resume", 1, {{"SD_FULL", "1"}}},
        Case{"sharded_even_w2", "sd_resume", 2, {{"SD_SHAPES", "even"}}},
        Case{"full_w2", "sd_resume", 2, {{"SD_FULL", "1"}}},
        Case{"sharded_uneven_w3", "sd_resume", 3, {}},
        Case{"full_uneven_w3", "sd_resume", 3, {{"SD_FULL", "1"}}},
        Case{"sharded_uneven_w4", "sd_resume", 4, {}},
        Case{"full_uneven_w4", "sd_resume", 4, {{"SD_FULL", "1"}}},
        Case{"sgd_w2", "sd_resume", 2, {{"SD_OPT", "sgd"}}},
        Case{"adam_amsgrad_full_w3", "sd_resume", 3, {{"SD_OPT", "adam"}, {"SD_FULL", "1"}}},
        Case{"adagrad_w3", "sd_resume", 3, {{"SD_OPT", "adagrad"}}},
        Case{"rmsprop_full_w2", "sd_resume", 2, {{"SD_OPT", "rmsprop"}, {"SD_FULL", "1"}}},
        Case{"mixed_precision_w2", "sd_resume", 2, {{"SD_VARIANT", "mp"}}},
        Case{"mixed_precision_full_w3", "sd_resume", 3, {{"SD_VARIANT", "mp"}, {"SD_FULL", "1"}}},
        Case{"frozen_w3", "sd_resume", 3, {{"SD_VARIANT", "frozen"}}},
        Case{"ignored_full_w2", "sd_resume", 2, {{"SD_VARIANT", "ignored"}, {"SD_FULL", "1"}}},
        Case{"ignored_w3", "sd_resume", 3, {{"SD_VARIANT", "ignored"}}},
        Case{"rank0_offload_w2", "sd_rank0", 2, {}}, Case{"rank0_offload_w3", "sd_rank0", 3, {}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tdist::fsdp

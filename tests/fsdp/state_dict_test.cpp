// FSDP state dicts (tdist/fsdp/state_dict.h), end to end at world 1-4 with real processes:
// full and sharded model + optimizer state dicts round-trip, and loading them into a fresh
// model and optimizer resumes training bitwise; uneven shapes (7 rows over 3 and 4 ranks),
// every supported optimizer, mixed precision, frozen and ignored parameters, cpu_offload (rank
// 0 only) + broadcast_from_rank0, and strict errors naming the key; get_state_dict /
// set_state_dict over two optimizers with a frozen parameter, and their keys against those
// PyTorch's get_state_dict gives for the same model (python/state_dict_keys.py).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <unordered_set>

#include "fsdp/tiny_transformer.h"
#include "support/expect.h"
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
double train_step(TinyTransformer& model, const std::vector<torch::optim::Optimizer*>& opts,
                  const TinyConfig& c, int step) {
  const int world = get_world_size(), rank = get_rank();
  auto [inputs, targets] = testing::tiny_batch(c, kLocalBatch * world, step);
  auto x = inputs.narrow(0, rank * kLocalBatch, kLocalBatch);
  auto y = targets.narrow(0, rank * kLocalBatch, kLocalBatch);
  for (auto* opt : opts) opt->zero_grad();
  auto loss = testing::lm_loss(tdist::fsdp::forward(model, x), y);
  loss.backward();
  for (auto* opt : opts) opt->step();
  auto global = torch::tensor({loss.item<double>()}, torch::kFloat64);
  all_reduce(global);
  return global.item<double>() / world;
}

double train_step(Setup& s, const TinyConfig& c, int step) {
  return train_step(s.model, {s.opt.get()}, c, step);
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

// Full state dicts with cpu_offload (rank 0's only, as PyTorch's), loading them back with
// broadcast_from_rank0, and strict errors naming the key (with broadcast_from_rank0 every rank
// raises, none hangs).
TDIST_SCENARIO(sd_rank0) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank();
  const TinyConfig c = config_from_env();
  Setup a = make_setup(c, 1234);
  for (int step = 0; step < 2; ++step) train_step(a, c, step);
  const auto r0 = StateDictOptions().full_state_dict(true).cpu_offload(true);
  const ShardedStateDict model_sd = get_model_state_dict(*a.model, r0);
  const ShardedStateDict optim_sd = get_optimizer_state_dict(*a.model, *a.opt, r0);
  const auto from_r0 = StateDictOptions().full_state_dict(true).broadcast_from_rank0(true);
  const auto all = StateDictOptions().full_state_dict(true);
  const ShardedStateDict model_all = get_model_state_dict(*a.model, all);
  const ShardedStateDict optim_all = get_optimizer_state_dict(*a.model, *a.opt, all);
  if (rank == 0) {
    expect_same(model_sd, model_all, "cpu_offload model");
    expect_same(optim_sd, optim_all, "cpu_offload optimizer");
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
  set_model_state_dict(*b.model, model_sd, from_r0);  // empty on ranks > 0: broadcast from 0
  set_optimizer_state_dict(*b.model, *b.opt, optim_sd, from_r0);
  expect_same(get_model_state_dict(*b.model, all), model_all, "model broadcast from rank 0");
  expect_same(get_optimizer_state_dict(*b.model, *b.opt, all), optim_all,
              "optimizer broadcast from rank 0");

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
  expect_error_naming([&] { set_model_state_dict(*b.model, r0_missing, from_r0); }, key, "rank0");
  ShardedStateDict bogus = optim_all;
  bogus["no.such.param.exp_avg"] = ShardedTensor::whole(torch::zeros({1}));
  expect_error_naming([&] { set_optimizer_state_dict(*b.model, *b.opt, bogus, all); },
                      "no.such.param.exp_avg", "optimizer");
  // Non-strict loads what matches.
  set_model_state_dict(*b.model, missing, StateDictOptions().full_state_dict(true).strict(false));
  destroy_process_group();
}

// ---- get_state_dict / set_state_dict ------------------------------------------------------

/// The tiny transformer with tok.weight frozen and two optimizers: AdamW on the blocks, SGD
/// with momentum on the other trainable parameters.
struct SplitSetup {
  TinyTransformer model{nullptr};
  std::unique_ptr<torch::optim::Optimizer> blocks_opt, rest_opt;
  std::vector<torch::optim::Optimizer*> optimizers() const {
    return {blocks_opt.get(), rest_opt.get()};
  }
};

SplitSetup make_split_setup(const TinyConfig& c, uint64_t seed) {
  SplitSetup s;
  s.model = testing::make_tiny(c, seed);
  s.model->register_buffer("scale", torch::arange(3, torch::kFloat) + static_cast<double>(seed));
  s.model->tok->weight.set_requires_grad(false);
  for (auto& block : s.model->blocks) fully_shard(block);
  fully_shard(s.model);
  std::vector<torch::Tensor> blocks, rest;
  std::unordered_set<const c10::TensorImpl*> in_blocks;
  for (auto& block : s.model->blocks) {
    for (const auto& p : block->parameters()) {
      blocks.push_back(p);
      in_blocks.insert(p.unsafeGetTensorImpl());
    }
  }
  for (const auto& p : s.model->parameters()) {
    if (p.requires_grad() && in_blocks.count(p.unsafeGetTensorImpl()) == 0) rest.push_back(p);
  }
  s.blocks_opt = make_optimizer("adamw", blocks);
  s.rest_opt = make_optimizer("sgd", rest);
  return s;
}

double train_step(SplitSetup& s, const TinyConfig& c, int step) {
  return train_step(s.model, s.optimizers(), c, step);
}

// get_state_dict is the model's state dict and the optimizers' merged; set_state_dict loads
// both into a fresh model and optimizers and training resumes bitwise. ignore_frozen_params
// leaves tok.weight out; such a dict loads with strict(false), reporting it missing, as
// PyTorch's. Full state dicts also round-trip through cpu_offload + broadcast_from_rank0.
TDIST_SCENARIO(sd_get_set) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank();
  const TinyConfig c = config_from_env();
  const bool full = env_str("SD_FULL", "0") == "1";
  const auto options = StateDictOptions().full_state_dict(full);
  const auto whole = StateDictOptions().full_state_dict(true);

  SplitSetup a = make_split_setup(c, 1234);
  for (int step = 0; step < kTrainSteps; ++step) train_step(a, c, step);
  const StateDicts taken = get_state_dict(*a.model, a.optimizers(), options);
  const ShardedStateDict model_sd = deep_copy(taken.model);
  const ShardedStateDict optim_sd = deep_copy(taken.optim);
  expect_same(model_sd, get_model_state_dict(*a.model, options), "model part");
  ShardedStateDict merged = get_optimizer_state_dict(*a.model, *a.blocks_opt, options);
  for (auto& [key, st] : get_optimizer_state_dict(*a.model, *a.rest_opt, options)) {
    merged.emplace(key, st);
  }
  expect_same(optim_sd, merged, "optimizer part");
  EXPECT_EQ(model_sd.count("tok.weight"), 1u);
  EXPECT_EQ(optim_sd.count("tok.weight.momentum_buffer"), 0u);  // frozen: in no optimizer
  EXPECT_EQ(optim_sd.count("block0.fc1.weight.exp_avg"), 1u);
  EXPECT_EQ(optim_sd.count("head.weight.momentum_buffer"), 1u);
  auto no_frozen_options = options;
  no_frozen_options.ignore_frozen_params(true);
  const ShardedStateDict no_frozen =
      deep_copy(get_state_dict(*a.model, a.optimizers(), no_frozen_options).model);
  EXPECT_EQ(no_frozen.size(), model_sd.size() - 1);
  EXPECT_EQ(no_frozen.count("tok.weight"), 0u);

  ShardedStateDict r0_model, r0_optim;
  if (full) {
    const StateDicts r0 = get_state_dict(
        *a.model, a.optimizers(), StateDictOptions().full_state_dict(true).cpu_offload(true));
    r0_model = deep_copy(r0.model);
    r0_optim = deep_copy(r0.optim);
    EXPECT_EQ(r0_model.empty(), rank != 0);
    EXPECT_EQ(r0_optim.empty(), rank != 0);
  }
  const double l1 = train_step(a, c, kTrainSteps);
  const double l2 = train_step(a, c, kTrainSteps + 1);
  const ShardedStateDict a_after = get_model_state_dict(*a.model, whole);

  auto expect_resumes = [&](SplitSetup& b, const std::string& what) {
    EXPECT_EQ(train_step(b, c, kTrainSteps), l1) << what << " on rank " << rank;
    EXPECT_EQ(train_step(b, c, kTrainSteps + 1), l2) << what << " on rank " << rank;
    expect_same(get_model_state_dict(*b.model, whole), a_after, what + ": two steps after");
  };
  SplitSetup b = make_split_setup(c, 999);  // other weights, optimizers without state
  const IncompatibleKeys keys =
      set_state_dict(*b.model, b.optimizers(), model_sd, optim_sd, options);
  EXPECT_TRUE(keys.missing_keys.empty());
  EXPECT_TRUE(keys.unexpected_keys.empty());
  const StateDicts loaded = get_state_dict(*b.model, b.optimizers(), options);
  expect_same(loaded.model, model_sd, "model after set_state_dict");
  expect_same(loaded.optim, optim_sd, "optimizers after set_state_dict");
  expect_resumes(b, "set_state_dict");

  if (full) {
    SplitSetup d = make_split_setup(c, 999);
    set_state_dict(*d.model, d.optimizers(), r0_model, r0_optim,
                   StateDictOptions().full_state_dict(true).broadcast_from_rank0(true));
    expect_resumes(d, "broadcast_from_rank0");
  }

  // Without the frozen parameter: strict refuses naming it; strict(false) reports it missing
  // and loads the rest (tok.weight keeps the fresh model's value).
  SplitSetup e = make_split_setup(c, 999);
  const at::Tensor fresh_tok = get_model_state_dict(*e.model, whole).at("tok.weight").local;
  tdist::testing::expect_invalid_argument(
      [&] { set_state_dict(*e.model, e.optimizers(), no_frozen, optim_sd, options); },
      "tok.weight");
  auto lenient = options;
  lenient.strict(false);
  const IncompatibleKeys partial =
      set_state_dict(*e.model, e.optimizers(), no_frozen, optim_sd, lenient);
  EXPECT_EQ(partial.missing_keys, std::vector<std::string>{"tok.weight"});
  EXPECT_TRUE(partial.unexpected_keys.empty());
  const ShardedStateDict e_full = get_model_state_dict(*e.model, whole);
  EXPECT_TRUE(bitwise_equal(e_full.at("tok.weight").local, fresh_tok));
  expect_same({{"head.weight", get_model_state_dict(*e.model, options).at("head.weight")}},
              {{"head.weight", model_sd.at("head.weight")}}, "loaded beside the missing key");

  // Bad input, raised alike on every rank.
  ShardedStateDict stray = optim_sd;
  stray["tok.weight.momentum_buffer"] = ShardedTensor::whole(torch::zeros({1}));
  tdist::testing::expect_invalid_argument(
      [&] { set_state_dict(*e.model, e.optimizers(), model_sd, stray, options); },
      "tok.weight.momentum_buffer");
  auto everything = make_optimizer("adamw", e.model->parameters());
  tdist::testing::expect_invalid_argument(
      [&] {
        get_state_dict(*e.model, {everything.get(), e.blocks_opt.get()}, options);
      },
      "held by optimizers[0] and optimizers[1]");
  tdist::testing::expect_invalid_argument(
      [&] {
        set_state_dict(*e.model, e.optimizers(), model_sd, optim_sd,
                       StateDictOptions().broadcast_from_rank0(true));
      },
      "broadcast_from_rank0 needs full_state_dict");
  destroy_process_group();
}

TEST(StateDictApi, GetSetStateDictRoundTrips) {
  for (const char* full : {"0", "1"}) {
    tdist::testing::ProcessOptions options;
    options.env = {{"SD_FULL", full}};
    tdist::testing::expect_all_ok_at_worlds("sd_get_set", {1, 2, 3}, options);
  }
}

// ---- keys against PyTorch's get_state_dict -------------------------------------------------

/// python/state_dict_keys.py's Mlp: fc1.bias frozen, a buffer.
struct KeysMlpImpl : torch::nn::Module {
  KeysMlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(5, 7));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({7})));
    fc2 = register_module("fc2", torch::nn::Linear(7, 3));
    scale = register_parameter("scale", torch::full({1}, 1.5));
    offset = register_buffer("offset", torch::zeros({3}));
    fc1->bias.set_requires_grad(false);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto h = torch::relu(norm(tdist::fsdp::forward(fc1, x)));
    return tdist::fsdp::forward(fc2, h) * scale + offset;
  }
  torch::nn::Linear fc1{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc2{nullptr};
  torch::Tensor scale, offset;
};
TORCH_MODULE(KeysMlp);

/// The keys of each kind ("model", "model_no_frozen", "optim") in the oracle's file.
std::map<std::string, std::set<std::string>> read_keys(const std::string& path) {
  std::map<std::string, std::set<std::string>> out;
  std::ifstream in(path);
  std::string kind, key;
  while (in >> kind >> key) out[kind].insert(key);
  return out;
}

std::set<std::string> keys_of(const ShardedStateDict& sd) {
  std::set<std::string> out;
  for (const auto& [key, st] : sd) out.insert(key);
  return out;
}

TDIST_SCENARIO(sd_keys) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const auto want = read_keys(env_str("SD_KEYS"));
  KeysMlp m;
  tdist::fsdp::fully_shard(m->fc1);
  tdist::fsdp::fully_shard(m->fc2);
  tdist::fsdp::fully_shard(m);
  std::vector<torch::Tensor> trainable;
  for (const auto& p : m->parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(1e-3));
  tdist::fsdp::forward(m, torch::randn({4, 5})).square().mean().backward();
  opt.step();
  for (const bool full : {false, true}) {
    const auto options = StateDictOptions().full_state_dict(full);
    const std::string what = full ? "full" : "sharded";
    const StateDicts sd = get_state_dict(*m, opt, options);
    EXPECT_EQ(keys_of(sd.model), want.at("model")) << what;
    EXPECT_EQ(keys_of(sd.optim), want.at("optim")) << what;
    auto no_frozen = options;
    no_frozen.ignore_frozen_params(true);
    EXPECT_EQ(keys_of(get_state_dict(*m, opt, no_frozen).model), want.at("model_no_frozen"))
        << what;
  }
  destroy_process_group();
}

TEST(StateDictApi, KeysMatchPyTorch) {
  const std::string dir = tdist::testing::make_temp_dir("sd-keys");
  const std::string cmd = tdist::testing::test_python() + " " + STATE_DICT_KEYS_PY + " " + dir +
                          "/keys.txt >" + dir + "/out.txt 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream in(dir + "/out.txt");
    const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (out.find("No module named") != std::string::npos) GTEST_SKIP() << out;
    FAIL() << cmd << "\n" << out;
  }
  tdist::testing::ProcessOptions options;
  options.env = {{"SD_KEYS", dir + "/keys.txt"}};
  tdist::testing::expect_all_ok_at_worlds("sd_keys", {1, 2, 3}, options);
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

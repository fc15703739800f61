// Deferred (meta-device) initialisation (Note [Deferred init]): a model built under
// MetaDeviceGuard, fully_shard'ed and materialised gets, at every world size, bitwise the
// full parameters init_parameters gives the same model built whole, holds only its shards,
// and trains exactly like that model sharded the ordinary way.
#include <gtest/gtest.h>

#include <string>

#include "fsdp/tiny_transformer.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/fsdp/deferred_init.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/state_dict.h"

namespace tdist::fsdp {
namespace {

using testing::TinyConfig;
using testing::TinyTransformer;
using testing::TinyTransformerImpl;

constexpr uint64_t kSeed = 2026;

// The tiny transformer's own parameter (pos) is not a LibTorch layer's: its init is ours.
void tiny_init(const std::string& name, torch::nn::Module& module) {
  if (auto* root = dynamic_cast<TinyTransformerImpl*>(&module)) {
    root->pos.normal_(0.0, 0.1);
    return;
  }
  reset_builtin_parameters(name, module);
}

MaterializeOptions tiny_options() {
  return MaterializeOptions().seed(kSeed).init_fn(tiny_init);
}

TinyTransformer build_on_meta(const TinyConfig& config) {
  MetaDeviceGuard meta;
  return TinyTransformer(config);
}

void shard(TinyTransformer& model) {
  for (auto& block : model->blocks) fully_shard(block);
  fully_shard(model);
}

at::Tensor cpu_generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// Every full parameter of `model` (gathered) equals, bit for bit, the same-named one of
// `expected` (whole).
void expect_full_params_equal(TinyTransformer& model, TinyTransformer& expected) {
  const auto full = get_model_state_dict(*model, StateDictOptions().full_state_dict(true));
  const auto want = expected->named_parameters();
  EXPECT_EQ(full.size(), want.size());
  for (const auto& item : want) {
    ASSERT_TRUE(full.count(item.key())) << item.key();
    EXPECT_TRUE(torch::equal(full.at(item.key()).local, item.value())) << item.key();
  }
}

TDIST_SCENARIO(deferred_init_tiny) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const TinyConfig config = testing::uneven_tiny_config();
  // The whole model, initialised the deferred way without deferring: what every world size
  // must reproduce.
  TinyTransformer whole(config);
  init_parameters(whole, tiny_options());

  const at::Tensor rng_before = cpu_generator_state();
  TinyTransformer model = build_on_meta(config);
  EXPECT_TRUE(torch::equal(cpu_generator_state(), rng_before)) << "a meta build drew numbers";
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.is_meta());
  EXPECT_TRUE(torch::ones({2}).is_cpu()) << "MetaDeviceGuard did not restore the device";
  shard(model);
  const torch::Tensor opt_param = model->tok->weight;  // identity survives materialize
  materialize(model, tiny_options());
  EXPECT_TRUE(torch::equal(cpu_generator_state(), rng_before)) << "materialize moved the RNG";
  EXPECT_TRUE(model->tok->weight.is_same(opt_param));
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(item.value().is_cpu()) << item.key();
    EXPECT_FALSE(item.value().is_meta()) << item.key();
  }
  expect_full_params_equal(model, whole);

  // The ordinary path: the whole model, then fully_shard. Same shards, so training is the
  // same to the bit.
  TinyTransformer ordinary(config);
  init_parameters(ordinary, tiny_options());
  shard(ordinary);
  EXPECT_EQ(testing::param_numel(*model), testing::param_numel(*ordinary)) << "shards only";
  auto opt = torch::optim::AdamW(model->parameters(), torch::optim::AdamWOptions(1e-2));
  auto ordinary_opt = torch::optim::AdamW(ordinary->parameters(), torch::optim::AdamWOptions(1e-2));
  const int world = get_world_size(), rank = get_rank();
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = testing::tiny_batch(config, 2 * world, step);
    x = x.narrow(0, 2 * rank, 2);
    y = y.narrow(0, 2 * rank, 2);
    for (auto* pair : {&model, &ordinary}) {
      auto& o = pair == &model ? opt : ordinary_opt;
      o.zero_grad();
      testing::lm_loss(tdist::fsdp::forward(*pair, x), y).backward();
      o.step();
    }
  }
  auto ordinary_params = ordinary->named_parameters();  // this rank's shards, both
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), ordinary_params[item.key()]))
        << "after training: " << item.key();
  }
  destroy_process_group();
}

TEST(DeferredInit, SameFullParametersAtEveryWorldSizeAndTrainsLikeTheOrdinaryPath) {
  tdist::testing::expect_all_ok_at_worlds("deferred_init_tiny", {1, 2, 3, 4});
}

// shard_placement_fn's Shard(-1) on the matrices (Note [Sharding on another dim]): the same
// full parameters from init_fn, and from a loader, which is given whole tensors for them.
TDIST_SCENARIO(deferred_init_shard_placement) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const TinyConfig config = testing::uneven_tiny_config();
  TinyTransformer whole(config);
  init_parameters(whole, tiny_options());
  const auto options = FullyShardOptions().shard_placement_fn(
      [](const std::string&, const at::Tensor& p) -> std::optional<tensor::Shard> {
        if (p.dim() < 2) return std::nullopt;
        return tensor::Shard(-1);
      });
  auto shard_on_last_dim = [&](TinyTransformer& model) {
    for (auto& block : model->blocks) fully_shard(block, options);
    fully_shard(model, options);
  };
  TinyTransformer initialised = build_on_meta(config);
  shard_on_last_dim(initialised);
  materialize(initialised, tiny_options());
  expect_full_params_equal(initialised, whole);

  const auto whole_params = whole->named_parameters();
  TinyTransformer loaded = build_on_meta(config);
  shard_on_last_dim(loaded);
  materialize(loaded, MaterializeOptions().load_fn([&](const TensorRows& part) {
    const at::Tensor& source = whole_params[part.name];
    if (source.dim() >= 2) EXPECT_EQ(part.rows.sizes(), source.sizes()) << part.name;
    part.rows.copy_(source.dim() == 0 ? source
                                      : source.narrow(0, part.row_begin, part.rows.size(0)));
  }));
  expect_full_params_equal(loaded, whole);
  destroy_process_group();
}

TEST(DeferredInit, ShardsOnAnotherDimHoldTheSameFullParameters) {
  tdist::testing::expect_all_ok_at_worlds("deferred_init_shard_placement", {2, 3});
}

// A model with buffers: BatchNorm's running statistics (LibTorch's reset) and one of its
// own (the init_fn's), materialised whole on every rank.
struct NormedNetImpl : torch::nn::Module {
  NormedNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 9));
    norm = register_module("norm", torch::nn::BatchNorm1d(9));
    fc2 = register_module("fc2", torch::nn::Linear(9, 3));
    scale = register_buffer("scale", torch::empty({3}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(norm(fc1(x))) * scale; }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(NormedNet);

void normed_init(const std::string& name, torch::nn::Module& module) {
  if (auto* net = dynamic_cast<NormedNetImpl*>(&module)) {
    net->scale.fill_(0.5);
    return;
  }
  reset_builtin_parameters(name, module);
}

TDIST_SCENARIO(deferred_init_buffers) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const auto options = MaterializeOptions().seed(7).init_fn(normed_init);
  NormedNet whole;
  init_parameters(whole, options);
  NormedNet model{nullptr};
  {
    MetaDeviceGuard meta;
    model = NormedNet();
  }
  fully_shard(model);
  materialize(model, options);
  const auto full = get_model_state_dict(*model, StateDictOptions().full_state_dict(true));
  for (const auto& item : whole->named_parameters()) {
    EXPECT_TRUE(torch::equal(full.at(item.key()).local, item.value())) << item.key();
  }
  for (const auto& item : whole->named_buffers()) {
    const at::Tensor mine = model->named_buffers()[item.key()];
    EXPECT_EQ(mine.sizes(), item.value().sizes()) << item.key() << " is whole";
    EXPECT_TRUE(torch::equal(mine, item.value())) << item.key();
  }
  EXPECT_TRUE(torch::equal(model->norm->running_var, torch::ones({9})));
  EXPECT_EQ(model->norm->num_batches_tracked.item<int64_t>(), 0);
  auto opt = torch::optim::SGD(model->parameters(), 0.1);
  tdist::fsdp::forward(model, torch::randn({4, 8})).sum().backward();
  opt.step();
  EXPECT_EQ(model->norm->num_batches_tracked.item<int64_t>(), 1);
  destroy_process_group();
}

TEST(DeferredInit, BuffersAreMaterialisedWholeAtWorlds2And3) {
  tdist::testing::expect_all_ok_at_worlds("deferred_init_buffers", {2, 3});
}

TDIST_SCENARIO(deferred_init_errors) {
  using tdist::testing::error_of;
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const TinyConfig config;
  auto contains = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };

  {  // Forward and state_dict before materialize name the fix.
    TinyTransformer model = build_on_meta(config);
    shard(model);
    auto idx = torch::zeros({1, config.seq}, torch::kLong);
    const std::string forward = error_of([&] { tdist::fsdp::forward(model, idx); });
    EXPECT_TRUE(contains(forward, "tdist::fsdp::materialize")) << forward;
    const std::string state = error_of([&] { get_model_state_dict(*model); });
    EXPECT_TRUE(contains(state, "meta device")) << state;
    // Without an init_fn for the model's own parameter: named, and nothing half-done, so
    // the call can be repeated with one.
    const std::string no_init = error_of([&] { materialize(model, MaterializeOptions()); });
    EXPECT_TRUE(contains(no_init, "TinyTransformerImpl") && contains(no_init, "init_fn"))
        << no_init;
    EXPECT_TRUE(model->pos.is_meta()) << "a failed init left the tensor allocated";
    materialize(model, tiny_options());
    TinyTransformer whole(config);
    init_parameters(whole, tiny_options());
    expect_full_params_equal(model, whole);
    materialize(model, tiny_options());  // nothing meta left: nothing happens
    expect_full_params_equal(model, whole);
  }
  {  // An init_fn that leaves a tensor unset is named.
    TinyTransformer model = build_on_meta(config);
    shard(model);
    const std::string forgot = error_of([&] {
      materialize(model, MaterializeOptions().init_fn([](const std::string& name, auto& m) {
        if (dynamic_cast<TinyTransformerImpl*>(&m) == nullptr) reset_builtin_parameters(name, m);
      }));
    });
    EXPECT_TRUE(contains(forgot, "'pos'") && contains(forgot, "NaN")) << forgot;
  }
  {  // Half meta, half real: refused by fully_shard.
    TinyTransformer model(config);
    {
      MetaDeviceGuard meta;
      model->ln_f = model->replace_module(
          "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.width})));
    }
    for (auto& block : model->blocks) fully_shard(block);
    const std::string mixed = error_of([&] { fully_shard(model); });
    EXPECT_TRUE(contains(mixed, "meta device") && contains(mixed, "MetaDeviceGuard")) << mixed;
  }
  {  // init_parameters needs whole tensors.
    TinyTransformer model(config);
    shard(model);
    const std::string sharded = error_of([&] { init_parameters(model, tiny_options()); });
    EXPECT_TRUE(contains(sharded, "fully_shard'ed already")) << sharded;
  }
  {  // Without FSDP, materialize gives whole tensors: init_parameters' values.
    TinyTransformer model = build_on_meta(config);
    materialize(model, tiny_options());
    TinyTransformer whole(config);
    init_parameters(whole, tiny_options());
    for (const auto& item : whole->named_parameters()) {
      EXPECT_TRUE(torch::equal(model->named_parameters()[item.key()], item.value())) << item.key();
    }
    // A different seed gives different values.
    TinyTransformer other(config);
    init_parameters(other, MaterializeOptions().seed(kSeed + 1).init_fn(tiny_init));
    EXPECT_FALSE(torch::equal(other->tok->weight, whole->tok->weight));
  }
  destroy_process_group();
}

TEST(DeferredInit, MisuseIsNamedWithItsFix) {
  tdist::testing::expect_all_ok(tdist::testing::run_ranks_as_processes("deferred_init_errors", 1));
}

}  // namespace
}  // namespace tdist::fsdp

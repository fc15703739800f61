// The FSDP1 surface (FullyShardedDataParallel): every sharding strategy trains the tiny
// transformer with parity against single-process training, also through device_id, a
// CustomPolicy and communication hooks (PyTorch's default hooks); auto-wrap policies wrap what
// they should, bottom-up; a CustomPolicy's per-module options equal fully_shard applied by
// hand with them; forward_method as forward; sync_module_states; ignored modules/parameters and
// ignored_states; mixed precision and offload options reach the core; bad options and hooks raise
// clear errors on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "fsdp/tiny_transformer.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/fsdp/comm_hooks.h"
#include "tdist/fsdp/fully_sharded_data_parallel.h"
#include "tdist/mesh/device_mesh.h"

namespace tdist::fsdp {
namespace {

using testing::TinyBlockImpl;
using testing::TinyConfig;
using testing::TinyTransformer;

constexpr int kSteps = 10;
constexpr int64_t kLocalBatch = 2;
constexpr double kTol = 1e-5;  // as fsdp_parity_test: fp32, same math, other summation order

using tdist::testing::env_str;

ShardingStrategy strategy_from_env() {
  const std::string s = env_str("FSDP1_STRATEGY", "FULL_SHARD");
  if (s == "SHARD_GRAD_OP") return ShardingStrategy::SHARD_GRAD_OP;
  if (s == "NO_SHARD") return ShardingStrategy::NO_SHARD;
  if (s == "HYBRID_SHARD") return ShardingStrategy::HYBRID_SHARD;
  if (s == "HYBRID_SHARD_ZERO2") return ShardingStrategy::HYBRID_SHARD_ZERO2;
  return ShardingStrategy::FULL_SHARD;
}

torch::optim::AdamW make_adamw(const std::vector<at::Tensor>& params) {
  return torch::optim::AdamW(params, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
}

// The full parameters of an FSDP model by name (collective).
std::map<std::string, at::Tensor> full_params(detail::FullyShardedBase& fsdp) {
  std::map<std::string, at::Tensor> out;
  auto handles = fsdp.fsdp_modules();
  for (auto& h : handles) h.unshard();
  for (const auto& item : fsdp.named_parameters()) out[item.key()] = item.value().detach().clone();
  for (auto& h : handles) h.reshard();
  return out;
}

/// A default hook's state that counts the hook's calls and checks the shapes it is given.
struct CountingState : default_hooks::LowPrecisionState {
  CountingState(ProcessGroupPtr group, std::string kind)
      : LowPrecisionState(std::move(group)), kind(std::move(kind)) {}
  std::string kind;  // reduce_scatter | allreduce | fp16 | bf16
  int calls = 0;
  int bad_shapes = 0;
};

void counting_hook(CountingState& s, const at::Tensor& grad, const at::Tensor& output) {
  ++s.calls;
  if (output.defined() && grad.numel() != output.numel() * s.world_size) ++s.bad_shapes;
  if (s.kind == "reduce_scatter") {
    default_hooks::reduce_scatter_hook(s, grad, output);
  } else if (s.kind == "allreduce") {
    default_hooks::allreduce_hook(s, grad);
  } else if (s.kind == "fp16") {
    default_hooks::fp16_compress_hook(s, grad, output);
  } else {
    default_hooks::bf16_compress_hook(s, grad, output);
  }
}

// Env: FSDP1_STRATEGY, FSDP1_POLICY (type | size | custom), FSDP1_LIMIT (1/0), FSDP1_BWD
// (pre | post | none), FSDP1_FWD (1/0), FSDP1_OFFLOAD (1/0), FSDP1_DEVICE_ID (cpu),
// FSDP1_HOOK (reduce_scatter | allreduce | fp16 | bf16), FSDP1_TOL (default kTol).
TDIST_SCENARIO(fsdp1_parity) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size();
  const int rank = get_rank();
  const TinyConfig c;
  const ShardingStrategy strategy = strategy_from_env();

  TinyTransformer ref = testing::make_tiny(c);
  auto ref_opt = make_adamw(ref->parameters());

  FSDPOptions opts;
  opts.sharding_strategy(strategy);
  if (env_str("FSDP1_POLICY", "type") == "size") {
    opts.auto_wrap_policy(size_based_auto_wrap_policy(1000));
  } else if (env_str("FSDP1_POLICY") == "custom") {
    opts.auto_wrap_policy(CustomPolicy([](const torch::nn::Module& m) -> CustomWrap {
      return dynamic_cast<const TinyBlockImpl*>(&m) != nullptr;
    }));
  } else {
    opts.auto_wrap_policy(module_type_wrap_policy<TinyBlockImpl>());
  }
  opts.limit_all_gathers(env_str("FSDP1_LIMIT", "1") == "1");
  const std::string bwd = env_str("FSDP1_BWD", "pre");
  if (bwd == "none") {
    opts.backward_prefetch(std::nullopt);
  } else if (bwd == "post") {
    opts.backward_prefetch(BackwardPrefetch::BACKWARD_POST);
  }
  opts.forward_prefetch(env_str("FSDP1_FWD", "0") == "1");
  if (env_str("FSDP1_OFFLOAD", "0") == "1") opts.cpu_offload(CPUOffload().offload_params(true));
  if (env_str("FSDP1_DEVICE_ID") == "cpu") opts.device_id(torch::kCPU);
  const double tol = std::stod(env_str("FSDP1_TOL", "1e-5"));

  FullyShardedDataParallel fsdp(testing::make_tiny(c), opts);
  EXPECT_TRUE(fsdp.compute_device().is_cpu());
  const std::string hook = env_str("FSDP1_HOOK");
  auto hook_state = std::make_shared<CountingState>(group_world(), hook);
  if (!hook.empty()) fsdp.register_comm_hook(hook_state, counting_hook);
  // Both policies pick exactly the blocks, bottom-up, then the root.
  EXPECT_EQ(fsdp.wrapped_module_names(), (std::vector<std::string>{"block0", "block1", ""}));
  for (auto& block : fsdp.module()->blocks) EXPECT_TRUE(is_fully_sharded(*block));
  EXPECT_FALSE(is_fully_sharded(*fsdp.module()->head));
  const auto& so = fsdp.fully_shard_options();
  const bool keeps = strategy == ShardingStrategy::SHARD_GRAD_OP ||
                     strategy == ShardingStrategy::NO_SHARD ||
                     strategy == ShardingStrategy::HYBRID_SHARD_ZERO2;
  EXPECT_EQ(so.reshard_after_forward().group_size(), keeps ? 1 : 0);
  EXPECT_EQ(so.forward_prefetch(), opts.forward_prefetch());
  EXPECT_EQ(so.backward_prefetch(), bwd != "none");
  EXPECT_EQ(so.all_gather_limit() > 1000, !opts.limit_all_gathers());
  EXPECT_EQ(so.offload_policy().offload_to_cpu(), env_str("FSDP1_OFFLOAD", "0") == "1");
  if (strategy != ShardingStrategy::FULL_SHARD && strategy != ShardingStrategy::SHARD_GRAD_OP) {
    ASSERT_TRUE(fsdp.device_mesh().has_value());
    EXPECT_EQ(fsdp.device_mesh()->ndim(), 2);
  }
  auto opt = make_adamw(fsdp.parameters());

  const int64_t global_batch = kLocalBatch * world;
  for (int step = 0; step < kSteps; ++step) {
    auto [inputs, targets] = testing::tiny_batch(c, global_batch, step);
    ref_opt.zero_grad();
    auto ref_loss = testing::lm_loss(ref->forward(inputs), targets);
    ref_loss.backward();
    ref_opt.step();

    opt.zero_grad();
    auto x = inputs.narrow(0, rank * kLocalBatch, kLocalBatch);
    auto y = targets.narrow(0, rank * kLocalBatch, kLocalBatch);
    auto loss = testing::lm_loss(fsdp.forward(x), y);
    loss.backward();
    if (step == 0) {  // the reduced gradients themselves (AdamW's step would hide a scale)
      auto full =
          fsdp.summon_full_params(SummonFullParamsOptions().writeback(false).with_grads(true));
      auto ref_params = ref->named_parameters();
      for (const auto& item : fsdp.named_parameters()) {
        const at::Tensor diff = item.value().grad() - ref_params[item.key()].grad();
        EXPECT_LE(diff.abs().max().item<double>(), tol) << item.key() << " rank " << rank;
      }
    }
    opt.step();
    auto global_loss = loss.detach().to(torch::kFloat64).reshape({1});
    all_reduce(global_loss);
    EXPECT_NEAR(global_loss.item<double>() / world, ref_loss.item<double>(), tol)
        << "step " << step;
  }
  if (!hook.empty()) {  // once per unit (the blocks and the root) and step, with its shapes
    EXPECT_EQ(hook_state->calls, 3 * kSteps);
    EXPECT_EQ(hook_state->bad_shapes, 0);
  }

  auto ref_params = ref->named_parameters();
  double max_diff = 0;
  for (const auto& [name, value] : full_params(fsdp)) {
    const auto& expected = ref_params[name];
    ASSERT_EQ(value.sizes(), expected.sizes()) << name;
    max_diff = std::max(max_diff, (value - expected).abs().max().item<double>());
  }
  EXPECT_LE(max_diff, tol) << "rank " << rank;
  int64_t local = 0, full = 0;
  for (const auto& p : fsdp.parameters()) local += p.numel();
  for (const auto& p : ref->parameters()) full += p.numel();
  if (strategy == ShardingStrategy::NO_SHARD || world == 1) {
    EXPECT_EQ(local, full);  // replicated: every rank holds everything
  } else {
    EXPECT_LT(local, full);
  }
  destroy_process_group();
}

struct Case {
  const char* name;
  int world;
  std::map<std::string, std::string> env;
};

class FSDP1Parity : public ::testing::TestWithParam<Case> {};

TEST_P(FSDP1Parity, MatchesSingleProcess) {
  const Case& p = GetParam();
  tdist::testing::ProcessOptions options;
  options.env = p.env;
  options.timeout = std::chrono::seconds(240);
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("fsdp1_parity", p.world, options));
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, FSDP1Parity,
    ::testing::Values(
        Case{"full_w2", 2, {}}, Case{"full_w3", 3, {{"FSDP1_POLICY", "size"}}},
        Case{"grad_op_w2", 2, {{"FSDP1_STRATEGY", "SHARD_GRAD_OP"}}},
        Case{"grad_op_w3",
             3,
             {{"FSDP1_STRATEGY", "SHARD_GRAD_OP"}, {"FSDP1_FWD", "1"}, {"FSDP1_BWD", "post"}}},
        Case{"no_shard_w2", 2, {{"FSDP1_STRATEGY", "NO_SHARD"}}},
        Case{"no_shard_w3", 3, {{"FSDP1_STRATEGY", "NO_SHARD"}, {"FSDP1_BWD", "none"}}},
        Case{"hybrid_w4",
             4,
             {{"FSDP1_STRATEGY", "HYBRID_SHARD"}, {"LOCAL_WORLD_SIZE", "2"}, {"FSDP1_LIMIT", "0"}}},
        Case{"hybrid_zero2_w4",
             4,
             {{"FSDP1_STRATEGY", "HYBRID_SHARD_ZERO2"}, {"LOCAL_WORLD_SIZE", "2"}}},
        Case{"offload_w2", 2, {{"FSDP1_OFFLOAD", "1"}}},
        Case{"custom_policy_device_id_cpu_w1",
             1,
             {{"FSDP1_POLICY", "custom"}, {"FSDP1_DEVICE_ID", "cpu"}}},
        Case{"custom_policy_device_id_cpu_w3",
             3,
             {{"FSDP1_POLICY", "custom"}, {"FSDP1_DEVICE_ID", "cpu"}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// ---- communication hooks ------------------------------------------------------------------

/// The parity scenario with `hook` registered, at each of `worlds`.
void expect_hook_parity(const std::string& hook, const std::string& strategy,
                        std::initializer_list<int> worlds, const std::string& tol = "1e-5") {
  tdist::testing::ProcessOptions options;
  options.env = {{"FSDP1_HOOK", hook}, {"FSDP1_STRATEGY", strategy}, {"FSDP1_TOL", tol}};
  options.timeout = std::chrono::seconds(240);
  tdist::testing::expect_all_ok_at_worlds("fsdp1_parity", worlds, options);
}

TEST(FSDP1CommHook, ReduceScatterHookMatchesSingleProcess) {
  expect_hook_parity("reduce_scatter", "FULL_SHARD", {1, 2, 3, 4});
}

TEST(FSDP1CommHook, AllReduceHookMatchesSingleProcess) {
  expect_hook_parity("allreduce", "NO_SHARD", {1, 2, 3});
}

// Gradients reduced in 16 bits: within what that precision allows of the float32 run.
TEST(FSDP1CommHook, CompressHooksStayCloseToSingleProcess) {
  expect_hook_parity("fp16", "SHARD_GRAD_OP", {3}, "1e-3");
  expect_hook_parity("bf16", "NO_SHARD", {2}, "1e-2");
  expect_hook_parity("bf16", "FULL_SHARD", {4}, "1e-2");
}

// Misuse, raised alike on every rank: hybrid strategies, a hook without output for a sharded
// strategy, a second hook, a null state, a hook after the first forward or on an inner
// wrapper; a hook that replaces its output fails the backward naming the unit.
TDIST_SCENARIO(fsdp1_comm_hook_errors) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  using tdist::testing::expect_invalid_argument;
  const TinyConfig c;
  auto state = std::make_shared<default_hooks::DefaultState>(group_world());
  auto policy = module_type_wrap_policy<TinyBlockImpl>();
  {
    auto mesh2d = mesh::init_device_mesh("cpu", {get_world_size(), 1}, {"replicate", "shard"});
    FullyShardedDataParallel hybrid(
        testing::make_tiny(c),
        FSDPOptions().sharding_strategy(ShardingStrategy::HYBRID_SHARD).device_mesh(mesh2d));
    expect_invalid_argument(
        [&] { hybrid.register_comm_hook(state, default_hooks::reduce_scatter_hook); }, "hybrid");
  }
  FullyShardedDataParallel fsdp(testing::make_tiny(c), FSDPOptions().auto_wrap_policy(policy));
  expect_invalid_argument([&] { fsdp.register_comm_hook(state, default_hooks::allreduce_hook); },
                          "needs hook(state, grad, output)");
  expect_invalid_argument(
      [&] {
        fsdp.register_comm_hook(std::shared_ptr<default_hooks::DefaultState>(),
                                default_hooks::reduce_scatter_hook);
      },
      "state is null");
  fsdp.register_comm_hook(state, default_hooks::reduce_scatter_hook);
  expect_invalid_argument(
      [&] { fsdp.register_comm_hook(state, default_hooks::reduce_scatter_hook); },
      "already registered");

  FullyShardedDataParallel ran(testing::make_tiny(c), FSDPOptions().auto_wrap_policy(policy));
  auto [inputs, targets] = testing::tiny_batch(c, 2, 0);
  testing::lm_loss(ran.forward(inputs), targets).backward();
  expect_invalid_argument(
      [&] { ran.register_comm_hook(state, default_hooks::reduce_scatter_hook); },
      "before the first forward");

  TinyTransformer outer_model = testing::make_tiny(c);
  FullyShardedDataParallel inner(outer_model->blocks[0]);
  FullyShardedDataParallel outer(outer_model);
  expect_invalid_argument(
      [&] { inner.register_comm_hook(state, default_hooks::reduce_scatter_hook); }, "outermost");

  FullyShardedDataParallel bad(testing::make_tiny(c), FSDPOptions().auto_wrap_policy(policy));
  bad.register_comm_hook(state, [](default_hooks::DefaultState&, const at::Tensor&,
                                   const at::Tensor& output) { output.set_data(at::zeros({1})); });
  std::string error = "<no error>";
  try {  // raised in autograd's backward, which may rethrow it as another exception type
    testing::lm_loss(bad.forward(inputs), targets).backward();
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("replaced output of unit 'block1'"), std::string::npos) << error;
  EXPECT_NE(error.find("in place"), std::string::npos) << error;
  destroy_process_group();
}

TEST(FSDP1CommHook, MisuseRaisesOnEveryRank) {
  tdist::testing::expect_all_ok_at_worlds("fsdp1_comm_hook_errors", {1, 2});
}

// ---- CustomPolicy -------------------------------------------------------------------------

// A CustomPolicy giving block0 the root's options and block1 SHARD_GRAD_OP with gradients
// reduced in bfloat16 (and block0 CPU offload under FSDP1_CUSTOM=offload) trains exactly as
// fully_shard applied by hand with the options the FSDP1 docs say these become.
TDIST_SCENARIO(fsdp1_custom_policy) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank();
  const TinyConfig c;
  const bool offload = env_str("FSDP1_CUSTOM") == "offload";
  const auto bf16 = MixedPrecision().reduce_dtype(torch::kBFloat16);
  TinyTransformer model = testing::make_tiny(c);
  const TinyBlockImpl* block0 = model->blocks[0].get();
  const TinyBlockImpl* block1 = model->blocks[1].get();
  FullyShardedDataParallel fsdp(
      model, FSDPOptions().auto_wrap_policy(CustomPolicy([&](const torch::nn::Module& m) {
        if (&m == block0) {
          return offload
                     ? CustomWrap(FSDPUnitOptions().cpu_offload(CPUOffload().offload_params(true)))
                     : CustomWrap(true);
        }
        if (&m == block1) {
          return CustomWrap(FSDPUnitOptions()
                                .sharding_strategy(ShardingStrategy::SHARD_GRAD_OP)
                                .mixed_precision(bf16));
        }
        return CustomWrap(FSDPUnitOptions());  // empty: not wrapped, as Python's {}
      })));
  EXPECT_EQ(fsdp.wrapped_module_names(), (std::vector<std::string>{"block0", "block1", ""}));

  TinyTransformer by_hand = testing::make_tiny(c);
  const FullyShardOptions base = fsdp.fully_shard_options();
  FullyShardOptions first = base;
  if (offload) first.offload_policy(CPUOffloadPolicy(/*pin_memory=*/false));
  FullyShardOptions second = base;
  second.reshard_after_forward(false).mp_policy(
      MixedPrecisionPolicy().reduce_dtype(torch::kBFloat16).cast_forward_inputs(false));
  fully_shard(by_hand->blocks[0], first);
  fully_shard(by_hand->blocks[1], second);
  fully_shard(by_hand, base);

  auto opt = make_adamw(fsdp.parameters());
  auto hand_opt = make_adamw(by_hand->parameters());
  for (int step = 0; step < 4; ++step) {
    auto [inputs, targets] = testing::tiny_batch(c, kLocalBatch * get_world_size(), step);
    auto x = inputs.narrow(0, rank * kLocalBatch, kLocalBatch);
    auto y = targets.narrow(0, rank * kLocalBatch, kLocalBatch);
    opt.zero_grad();
    hand_opt.zero_grad();
    auto loss = testing::lm_loss(fsdp.forward(x), y);
    auto hand_loss = testing::lm_loss(tdist::fsdp::forward(by_hand, x), y);
    loss.backward();
    hand_loss.backward();
    opt.step();
    hand_opt.step();
    EXPECT_EQ(loss.item<double>(), hand_loss.item<double>()) << "step " << step;
  }
  const auto got = model->named_parameters();
  for (const auto& item : by_hand->named_parameters()) {
    EXPECT_TRUE(torch::equal(got[item.key()], item.value())) << item.key() << " rank " << rank;
  }
  // SHARD_GRAD_OP keeps block1 unsharded for backward: fewer all-gathers than block0 (with
  // more than one rank: a group of one has nothing to gather again).
  const int64_t gathers0 = fsdp_module(*model->blocks[0]).stats().all_gathers;
  const int64_t gathers1 = fsdp_module(*model->blocks[1]).stats().all_gathers;
  if (get_world_size() > 1) {
    EXPECT_LT(gathers1, gathers0);
  }
  EXPECT_EQ(gathers1, fsdp_module(*by_hand->blocks[1]).stats().all_gathers);
  destroy_process_group();
}

TEST(FSDP1, CustomPolicyOverridesMatchFullyShardByHand) {
  tdist::testing::expect_all_ok_at_worlds("fsdp1_custom_policy", {1, 2, 3});
  tdist::testing::ProcessOptions offload;
  offload.env = {{"FSDP1_CUSTOM", "offload"}};
  tdist::testing::expect_all_ok_at_worlds("fsdp1_custom_policy", {2}, offload);
}

// ---- auto-wrap policies -------------------------------------------------------------------

std::vector<std::string> wrapped_by(const AutoWrapPolicy& policy, FSDPOptions opts = {}) {
  TinyTransformer model = testing::make_tiny(TinyConfig{});
  FullyShardedDataParallel fsdp(model, opts.auto_wrap_policy(policy));
  // What the wrapper reports is what fully_shard was applied to.
  std::vector<std::string> sharded;
  for (const auto& item : model->named_modules()) {
    if (is_fully_sharded(*item.value())) sharded.push_back(item.key());
  }
  std::vector<std::string> reported = fsdp.wrapped_module_names();
  std::sort(reported.begin(), reported.end());
  std::sort(sharded.begin(), sharded.end());
  EXPECT_EQ(reported, sharded);
  return fsdp.wrapped_module_names();
}

using Names = std::vector<std::string>;

TDIST_SCENARIO(fsdp1_auto_wrap) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  // No policy: the root only.
  EXPECT_EQ(wrapped_by(nullptr), (Names{""}));
  // By type, bottom-up: children before their parents, the root last.
  EXPECT_EQ(wrapped_by(module_type_wrap_policy<TinyBlockImpl>()), (Names{"block0", "block1", ""}));
  EXPECT_EQ(wrapped_by(module_type_wrap_policy<TinyBlockImpl, torch::nn::LinearImpl>()),
            (Names{"block0.qkv", "block0.proj", "block0.fc1", "block0.fc2", "block0", "block1.qkv",
                   "block1.proj", "block1.fc1", "block1.fc2", "block1", "head", ""}));
  // By size. A block has 2176 parameters; qkv 768, fc1 544, fc2 528, proj 272; the root's
  // own children tok 368, head 391.
  EXPECT_EQ(wrapped_by(size_based_auto_wrap_policy(1000)), (Names{"block0", "block1", ""}));
  // At 500 the big linears are wrapped; what remains of a block (336) is too small.
  EXPECT_EQ(wrapped_by(size_based_auto_wrap_policy(500)),
            (Names{"block0.qkv", "block0.fc1", "block0.fc2", "block1.qkv", "block1.fc1",
                   "block1.fc2", ""}));
  EXPECT_EQ(wrapped_by(size_based_auto_wrap_policy(100000000)), (Names{""}));
  // Lambda policy.
  EXPECT_EQ(wrapped_by(lambda_auto_wrap_policy([](const torch::nn::Module& m) {
              return dynamic_cast<const torch::nn::EmbeddingImpl*>(&m) != nullptr;
            })),
            (Names{"tok", ""}));
  // Ignored modules are neither wrapped nor descended into.
  TinyTransformer model = testing::make_tiny(TinyConfig{});
  FullyShardedDataParallel fsdp(
      model, FSDPOptions()
                 .auto_wrap_policy(module_type_wrap_policy<TinyBlockImpl, torch::nn::LinearImpl>())
                 .ignored_modules({model->blocks[1].ptr()}));
  EXPECT_EQ(fsdp.wrapped_module_names(),
            (Names{"block0.qkv", "block0.proj", "block0.fc1", "block0.fc2", "block0", "head", ""}));
  EXPECT_FALSE(is_fully_sharded(*model->blocks[1]));
  EXPECT_FALSE(is_fully_sharded(*model->blocks[1]->fc1));
  EXPECT_EQ(fsdp.fsdp_modules().size(), 7u);
  destroy_process_group();
}

TEST(FSDP1, AutoWrapPolicies) {
  tdist::testing::expect_all_ok(tdist::testing::run_ranks_as_processes("fsdp1_auto_wrap", 2));
}

// ---- sync_module_states -------------------------------------------------------------------

TDIST_SCENARIO(fsdp1_sync_module_states) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank();
  const TinyConfig c;
  TinyTransformer model = testing::make_tiny(c, /*seed=*/100 + rank);  // differs per rank
  model->register_buffer("scale", torch::full({3}, static_cast<float>(rank + 1)));
  FullyShardedDataParallel fsdp(model,
                                FSDPOptions()
                                    .auto_wrap_policy(module_type_wrap_policy<TinyBlockImpl>())
                                    .sync_module_states(true));
  TinyTransformer rank0 = testing::make_tiny(c, /*seed=*/100);
  auto expected = rank0->named_parameters();
  for (const auto& [name, value] : full_params(fsdp)) {
    EXPECT_TRUE(torch::equal(value, expected[name])) << name << " on rank " << rank;
  }
  EXPECT_TRUE(torch::equal(model->named_buffers()["scale"], torch::full({3}, 1.0f)));
  destroy_process_group();
}

TEST(FSDP1, SyncModuleStates) {
  for (int world : {2, 3}) {
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("fsdp1_sync_module_states", world));
  }
}

// ---- forward_method ------------------------------------------------------------------------

// A method named as the forward runs through FSDP as forward() does: the root's parameters are
// gathered for it (a bypass would meet shards), and output and gradients equal forward()'s.
TDIST_SCENARIO(fsdp1_forward_method) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const TinyConfig c;
  TinyTransformer model = testing::make_tiny(c);
  FullyShardedDataParallel fsdp(
      model, FSDPOptions().auto_wrap_policy(module_type_wrap_policy<TinyBlockImpl>()));
  auto [inputs, targets] = testing::tiny_batch(c, 2, /*step=*/0);
  auto grads_of = [&](const at::Tensor& logits) {
    for (auto& p : fsdp.parameters()) p.mutable_grad() = at::Tensor();
    testing::lm_loss(logits, targets).backward();
    std::vector<at::Tensor> grads;
    for (auto& p : fsdp.parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const at::Tensor by_forward = fsdp.forward(inputs);
  const auto forward_grads = grads_of(by_forward);
  const at::Tensor by_method = fsdp.forward_method(&testing::TinyTransformerImpl::forward, inputs);
  const auto method_grads = grads_of(by_method);
  EXPECT_TRUE(by_method.equal(by_forward));
  ASSERT_EQ(method_grads.size(), forward_grads.size());
  for (size_t i = 0; i < method_grads.size(); ++i) {
    EXPECT_TRUE(method_grads[i].equal(forward_grads[i])) << "parameter " << i;
  }
  destroy_process_group();
}

TEST(FSDP1, ForwardMethodRunsThroughFSDP) {
  for (int world : {2, 3}) {
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("fsdp1_forward_method", world));
  }
}

// ---- ignored modules and parameters -------------------------------------------------------

TDIST_SCENARIO(fsdp1_ignored) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank();
  const TinyConfig c;
  TinyTransformer model = testing::make_tiny(c);
  const auto head_w = model->head->weight.sizes().vec();
  const auto pos = model->pos.sizes().vec();
  const auto tok = model->tok->weight.sizes().vec();
  FullyShardedDataParallel fsdp(model,
                                FSDPOptions()
                                    .auto_wrap_policy(module_type_wrap_policy<TinyBlockImpl>())
                                    .ignored_modules({model->head.ptr()})
                                    .ignored_parameters({model->pos}));
  EXPECT_FALSE(is_fully_sharded(*model->head));
  EXPECT_LT(model->tok->weight.size(0), tok[0]);  // sharded
  auto opt = make_adamw(fsdp.parameters());
  for (int step = 0; step < 2; ++step) {
    auto [inputs, targets] = testing::tiny_batch(c, 2 * get_world_size(), step);
    opt.zero_grad();
    auto loss = testing::lm_loss(fsdp.forward(inputs.narrow(0, rank * 2, 2)),
                                 targets.narrow(0, rank * 2, 2));
    loss.backward();
    opt.step();
  }
  // Unsharded at rest, and never reduced: each rank trained its copy on its own batch.
  EXPECT_EQ(model->head->weight.sizes().vec(), head_w);
  EXPECT_EQ(model->pos.sizes().vec(), pos);
  auto spread =
      torch::stack({model->head->weight.detach().clone(), -model->head->weight.detach().clone()});
  all_reduce(spread, ReduceOp::MAX);
  EXPECT_GT((spread[0] + spread[1]).abs().max().item<double>(), 0.0)
      << "ignored parameters were synchronised";
  destroy_process_group();
}

TEST(FSDP1, IgnoredModulesStayUnsharded) {
  tdist::testing::expect_all_ok(tdist::testing::run_ranks_as_processes("fsdp1_ignored", 2));
}

// ignored_states: modules (all of them) or parameters (all of them) left alone, as the older
// ignored_modules / ignored_parameters.
TDIST_SCENARIO(fsdp1_ignored_states) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const TinyConfig c;
  auto policy = module_type_wrap_policy<TinyBlockImpl, torch::nn::LinearImpl>();
  {
    TinyTransformer model = testing::make_tiny(c);
    const auto head = model->head->weight.sizes().vec();
    FullyShardedDataParallel fsdp(model, FSDPOptions().auto_wrap_policy(policy).ignored_states(
                                             {model->head, model->blocks[1]}));
    EXPECT_EQ(fsdp.wrapped_module_names(),
              (std::vector<std::string>{"block0.qkv", "block0.proj", "block0.fc1", "block0.fc2",
                                        "block0", ""}));
    EXPECT_EQ(model->head->weight.sizes().vec(), head);
    EXPECT_FALSE(is_fully_sharded(*model->blocks[1]));
  }
  {
    TinyTransformer model = testing::make_tiny(c);
    const auto pos = model->pos.sizes().vec();
    FullyShardedDataParallel fsdp(model,
                                  FSDPOptions().ignored_states({model->pos, model->head->weight}));
    EXPECT_EQ(model->pos.sizes().vec(), pos);
    EXPECT_EQ(fsdp.fully_shard_options().ignored_params().size(), 2u);
    if (get_world_size() > 1) {
      EXPECT_LT(model->head->bias.size(0), c.vocab);  // sharded
    }
  }
  using tdist::testing::expect_invalid_argument;
  TinyTransformer model = testing::make_tiny(c);
  expect_invalid_argument(
      [&] {
        FullyShardedDataParallel f(model, FSDPOptions().ignored_states({model->head, model->pos}));
      },
      "mixes 1 module(s) and 1 parameter(s)");
  expect_invalid_argument(
      [&] {
        FullyShardedDataParallel f(
            model, FSDPOptions().ignored_states({model->head}).ignored_modules({model->tok.ptr()}));
      },
      "pass only ignored_states");
  expect_invalid_argument(
      [&] { FullyShardedDataParallel f(model, FSDPOptions().ignored_states({torch::zeros({2})})); },
      "ignored_states[0] is not a parameter");
  destroy_process_group();
}

TEST(FSDP1, IgnoredStates) {
  tdist::testing::expect_all_ok_at_worlds("fsdp1_ignored_states", {1, 2, 3});
}

// ---- mixed precision options --------------------------------------------------------------

TDIST_SCENARIO(fsdp1_mixed_precision) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  TinyTransformer model = testing::make_tiny(TinyConfig{});
  model->register_buffer("scale", torch::ones({3}));
  FullyShardedDataParallel fsdp(model,
                                FSDPOptions()
                                    .auto_wrap_policy(module_type_wrap_policy<TinyBlockImpl>())
                                    .mixed_precision(MixedPrecision()
                                                         .param_dtype(torch::kBFloat16)
                                                         .reduce_dtype(torch::kFloat32)
                                                         .buffer_dtype(torch::kBFloat16)));
  const auto& mp = fsdp.fully_shard_options().mp_policy();
  EXPECT_EQ(mp.param_dtype(), std::optional<c10::ScalarType>(torch::kBFloat16));
  EXPECT_EQ(mp.reduce_dtype(), std::optional<c10::ScalarType>(torch::kFloat32));
  EXPECT_TRUE(mp.cast_forward_inputs());  // cast_root_forward_inputs
  EXPECT_EQ(model->named_buffers()["scale"].scalar_type(), torch::kBFloat16);
  for (const auto& p : fsdp.parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  destroy_process_group();
}

TEST(FSDP1, MixedPrecisionOptions) {
  tdist::testing::expect_all_ok(tdist::testing::run_ranks_as_processes("fsdp1_mixed_precision", 2));
}

// ---- bad options --------------------------------------------------------------------------

// Runs `fn`, expecting InvalidArgument whose message contains `needle`.
template <class F>
void expect_invalid(F fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_NE(what.find("rank"), std::string::npos) << what;
  }
}

TDIST_SCENARIO(fsdp1_bad_options) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const TinyConfig c;
  auto hybrid = FSDPOptions().sharding_strategy(ShardingStrategy::HYBRID_SHARD);
  setenv("LOCAL_WORLD_SIZE", "3", 1);  // does not divide the world of 2
  expect_invalid([&] { FullyShardedDataParallel f(testing::make_tiny(c), hybrid); },
                 "LOCAL_WORLD_SIZE=3");
  unsetenv("LOCAL_WORLD_SIZE");
  expect_invalid([&] { FullyShardedDataParallel f(testing::make_tiny(c), hybrid); },
                 "LOCAL_WORLD_SIZE");
  auto mesh2d = mesh::init_device_mesh("cpu", {2, 1}, {"replicate", "shard"});
  expect_invalid(
      [&] { FullyShardedDataParallel f(testing::make_tiny(c), FSDPOptions().device_mesh(mesh2d)); },
      "must be 1-D");
  expect_invalid(
      [&] {
        FullyShardedDataParallel f(
            testing::make_tiny(c),
            FSDPOptions().device_mesh(mesh2d["shard"]).process_group(group_world()));
      },
      "only one");
  expect_invalid(
      [&] {
        FullyShardedDataParallel f(testing::make_tiny(c),
                                   FSDPOptions().ignored_parameters({torch::zeros({2})}));
      },
      "not a parameter");
  // device_id: a CUDA device this process cannot use, or another device type.
  if (!tdist::testing::has_gpu()) {
    expect_invalid(
        [&] { FullyShardedDataParallel f(testing::make_tiny(c), FSDPOptions().device_id(0)); },
        "device_id cuda:0, but this process sees no CUDA device");
    expect_invalid(
        [&] {
          FullyShardedDataParallel f(testing::make_tiny(c),
                                     FSDPOptions().device_id(torch::Device("cuda")));
        },
        "pass torch::kCPU");
  } else {
    expect_invalid(
        [&] { FullyShardedDataParallel f(testing::make_tiny(c), FSDPOptions().device_id(99)); },
        "usually LOCAL_RANK");
  }
  expect_invalid(
      [&] {
        FullyShardedDataParallel f(testing::make_tiny(c), FSDPOptions().device_id(torch::kMeta));
      },
      "is not supported");
  // CustomPolicy options the core cannot honour.
  expect_invalid(
      [&] {
        FullyShardedDataParallel f(
            testing::make_tiny(c),
            FSDPOptions().auto_wrap_policy(
                CustomPolicy([](const torch::nn::Module& m) -> CustomWrap {
                  if (dynamic_cast<const TinyBlockImpl*>(&m) == nullptr) {
                    return false;
                  }
                  return FSDPUnitOptions().sharding_strategy(ShardingStrategy::NO_SHARD);
                })));
      },
      "needs another mesh");
  expect_invalid(
      [&] {
        FullyShardedDataParallel f(testing::make_tiny(c),
                                   FSDPOptions().auto_wrap_policy(
                                       CustomPolicy([](const torch::nn::Module& m) -> CustomWrap {
                                         if (dynamic_cast<const TinyBlockImpl*>(&m) == nullptr)
                                           return false;
                                         return FSDPUnitOptions().mixed_precision(
                                             MixedPrecision().buffer_dtype(torch::kBFloat16));
                                       })));
      },
      "buffer_dtype");
  TinyTransformer model = testing::make_tiny(c);
  FullyShardedDataParallel once(model);
  expect_invalid([&] { FullyShardedDataParallel twice(model); }, "already sharded");
  destroy_process_group();
}

TEST(FSDP1, BadOptionsRaiseOnEveryRank) {
  tdist::testing::expect_all_ok(tdist::testing::run_ranks_as_processes("fsdp1_bad_options", 2));
}

}  // namespace
}  // namespace tdist::fsdp

// End-to-end parity: FSDP training at world 1-4 against single-process training on the
// concatenated batches, every step, with AdamW; full shard, reshard_after_forward false and
// integer, uneven shapes, gradient accumulation; the bypass error, and models that differ
// across ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "fsdp/tiny_transformer.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/symmetric_memory.h"
#include "tdist/error.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/mesh/device_mesh.h"

namespace tdist::fsdp {
namespace {

using testing::TinyConfig;
using testing::TinyTransformer;

constexpr int kSteps = 20;
constexpr int64_t kLocalBatch = 2;
constexpr double kTol = 1e-5;

using tdist::testing::env_str;

TinyConfig config_from_env() {
  TinyConfig c = env_str("FSDP_TEST_SHAPES", "even") == "uneven" ? testing::uneven_tiny_config()
                                                                 : TinyConfig();
  if (env_str("FSDP_TEST_INPLACE_OUTPUTS", "0") == "1") c.inplace_output_scale = 0.5;
  return c;
}

torch::optim::AdamW make_adamw(TinyTransformer& model) {
  return torch::optim::AdamW(model->parameters(),
                             torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
}

// LibTorch 2.x's Optimizer::zero_grad() sets gradients to none (1.13's zeroes them); FSDP's
// sharded gradients must be recreated after either.
void clear_grads(torch::optim::Optimizer& opt, bool to_none) {
  if (!to_none) return opt.zero_grad();
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) p.mutable_grad() = at::Tensor();
  }
}

// One training scenario, configured by env: FSDP_TEST_RESHARD ("true", "false", or k),
// FSDP_TEST_ACCUM (micro-batches per step), FSDP_TEST_SHAPES ("even"/"uneven"),
// FSDP_TEST_GRADS_TO_NONE ("1": clear gradients as LibTorch 2.x's zero_grad() does),
// FSDP_TEST_INPLACE_OUTPUTS ("1": scale each block's output in place).
void run_parity() {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size();
  const int rank = get_rank();
  const TinyConfig c = config_from_env();
  const std::string reshard = env_str("FSDP_TEST_RESHARD", "true");
  const int accum = std::atoi(env_str("FSDP_TEST_ACCUM", "1").c_str());
  const bool prefetch = env_str("FSDP_TEST_PREFETCH", "1") == "1";
  const bool to_none = env_str("FSDP_TEST_GRADS_TO_NONE", "0") == "1";

  // Reference: one process, the whole global batch.
  TinyTransformer ref = testing::make_tiny(c);
  auto ref_opt = make_adamw(ref);

  TinyTransformer model = testing::make_tiny(c);
  FullyShardOptions opts;
  opts.prefetch(prefetch);
  if (reshard == "false") {
    opts.reshard_after_forward(false);
  } else if (reshard != "true") {
    opts.reshard_after_forward(std::atoi(reshard.c_str()));
  }
  for (auto& block : model->blocks) fully_shard(block, opts);
  FSDPModule root = fully_shard(model, opts);
  auto opt = make_adamw(model);
  // Note [Pooled blocks in symmetric memory]: where the ranks agreed on it, the shards live
  // in symmetric memory (FSDP_TEST_EXPECT_SYMMETRIC, set by the test that knows the ranks'
  // TDIST_FSDP_SYMMETRIC).
  const std::string expect_symmetric = env_str("FSDP_TEST_EXPECT_SYMMETRIC", "");
  if (!expect_symmetric.empty()) {
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(symmetric_memory::is_symmetric(p), expect_symmetric == "1") << "rank " << rank;
    }
  }

  const int64_t global_batch = kLocalBatch * world * accum;
  for (int step = 0; step < kSteps; ++step) {
    auto [inputs, targets] = testing::tiny_batch(c, global_batch, step);
    clear_grads(ref_opt, to_none);
    auto ref_loss = testing::lm_loss(ref->forward(inputs), targets);
    ref_loss.backward();
    ref_opt.step();

    clear_grads(opt, to_none);
    double loss_sum = 0;
    for (int micro = 0; micro < accum; ++micro) {
      // Rank r's micro-batch m: rows [(m * world + r) * B, ... + B) of the global batch.
      const int64_t first = (static_cast<int64_t>(micro) * world + rank) * kLocalBatch;
      auto x = inputs.narrow(0, first, kLocalBatch);
      auto y = targets.narrow(0, first, kLocalBatch);
      auto loss = testing::lm_loss(tdist::fsdp::forward(model, x), y) / accum;
      loss.backward();
      loss_sum += loss.item<double>();
    }
    opt.step();
    auto global_loss = torch::tensor({loss_sum}, torch::kFloat64);
    all_reduce(global_loss);
    const double fsdp_loss = global_loss.item<double>() / world;
    EXPECT_NEAR(fsdp_loss, ref_loss.item<double>(), kTol) << "step " << step;
  }

  // Gather the final parameters and compare with the reference.
  auto handles = testing::tiny_handles(model, root);
  EXPECT_LE(testing::max_param_diff(model, handles, ref), kTol) << "rank " << rank;
  // Sharded at rest again: the parameters hold their local shards.
  if (world > 1) {
    EXPECT_LT(testing::param_numel(*model), testing::param_numel(*ref));
  }
  destroy_process_group();
}

TDIST_SCENARIO(fsdp_parity) {
  run_parity();
}

struct ParityCase {
  const char* name;
  int world;
  std::map<std::string, std::string> env;
};

class FSDPParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(FSDPParity, MatchesSingleProcess) {
  const ParityCase& p = GetParam();
  tdist::testing::ProcessOptions options;
  options.env = p.env;
  options.timeout = std::chrono::seconds(240);
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("fsdp_parity", p.world, options));
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, FSDPParity,
    ::testing::Values(
        ParityCase{"full_w1", 1, {}}, ParityCase{"full_w2", 2, {}}, ParityCase{"full_w3", 3, {}},
        ParityCase{"full_w4", 4, {}}, ParityCase{"noprefetch_w2", 2, {{"FSDP_TEST_PREFETCH", "0"}}},
        ParityCase{"zero2_w2", 2, {{"FSDP_TEST_RESHARD", "false"}}},
        ParityCase{"zero2_w3", 3, {{"FSDP_TEST_RESHARD", "false"}}},
        ParityCase{"int2_w4", 4, {{"FSDP_TEST_RESHARD", "2"}}},
        ParityCase{"uneven_w3", 3, {{"FSDP_TEST_SHAPES", "uneven"}}},
        ParityCase{"uneven_w4", 4, {{"FSDP_TEST_SHAPES", "uneven"}}},
        ParityCase{
            "uneven_int2_w4", 4, {{"FSDP_TEST_SHAPES", "uneven"}, {"FSDP_TEST_RESHARD", "2"}}},
        ParityCase{"accum_w2", 2, {{"FSDP_TEST_ACCUM", "2"}}},
        ParityCase{"grads_to_none_w3", 3, {{"FSDP_TEST_GRADS_TO_NONE", "1"}}},
        ParityCase{"inplace_outputs_w2", 2, {{"FSDP_TEST_INPLACE_OUTPUTS", "1"}}},
        ParityCase{"grads_to_none_accum_zero2_w2",
                   2,
                   {{"FSDP_TEST_GRADS_TO_NONE", "1"},
                    {"FSDP_TEST_ACCUM", "2"},
                    {"FSDP_TEST_RESHARD", "false"}}},
        ParityCase{
            "accum_zero2_w3", 3, {{"FSDP_TEST_ACCUM", "3"}, {"FSDP_TEST_RESHARD", "false"}}}),
    [](const ::testing::TestParamInfo<ParityCase>& info) { return std::string(info.param.name); });

// Ranks that disagree on TDIST_FSDP_SYMMETRIC agree at fully_shard on ordinary memory, and
// train as before; ranks that all allow it hold their shards in symmetric memory.
TEST(FSDPSymmetricBuffers, RanksAgreeOnTheMemoryOfTheirBuffers) {
  if (!symmetric_memory::is_available()) GTEST_SKIP() << "no POSIX shared memory here";
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    tdist::testing::ProcessOptions all_on;
    all_on.timeout = std::chrono::seconds(240);
    all_on.env = {{"TDIST_FSDP_PERSISTENT_BUFFERS", "1"},
                  {"TDIST_FSDP_SYMMETRIC", "1"},
                  {"FSDP_TEST_EXPECT_SYMMETRIC", "1"}};
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("fsdp_parity", world, all_on));
    tdist::testing::ProcessOptions one_off = all_on;
    one_off.env["FSDP_TEST_EXPECT_SYMMETRIC"] = "0";
    one_off.rank_env[world - 1] = {{"TDIST_FSDP_SYMMETRIC", "0"}};
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("fsdp_parity", world, one_off));
  }
}

// ---- bypass -------------------------------------------------------------------------------

// A model whose forward calls its sharded blocks directly, bypassing FSDP.
class BypassModelImpl : public torch::nn::Module {
 public:
  explicit BypassModelImpl(const TinyConfig& c) {
    tok = register_module("tok", torch::nn::Embedding(c.vocab, c.width));
    block = register_module("block", testing::TinyBlock(c));
    head = register_module("head", torch::nn::Linear(c.width, c.vocab));
  }
  torch::Tensor forward(torch::Tensor idx) { return head(block(tok(idx))); }  // no fsdp::forward
  torch::nn::Embedding tok{nullptr};
  testing::TinyBlock block{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(BypassModel);

TDIST_SCENARIO(fsdp_bypass) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  TinyConfig c;
  c.hidden = 16;  // fc1/fc2 square: shards still multiply, a silent-corruption hazard
  int raised = 0;
  {
    BypassModel model(c);
    fully_shard(model->block);
    fully_shard(model);
    auto x = torch::randint(c.vocab, {2, c.seq}, torch::kLong);
    try {
      auto out = tdist::fsdp::forward(model, x);
    } catch (const tdist::Error& e) {
      ++raised;
      std::cout << "raised: " << e.what() << std::endl;
    } catch (const c10::Error& e) {
      ++raised;  // a shape error from computing on shards also stops it
      std::cout << "shape error: " << e.what() << std::endl;
    }
  }
  {
    // The root itself called directly: its blocks' fsdp::forward raises.
    TinyTransformer model = testing::make_tiny(c);
    for (auto& block : model->blocks) fully_shard(block);
    fully_shard(model);
    auto x = torch::randint(c.vocab, {2, c.seq}, torch::kLong);
    try {
      model->forward(x);
    } catch (const tdist::Error& e) {
      ++raised;
      const std::string what = e.what();
      EXPECT_NE(what.find("root"), std::string::npos) << what;
    } catch (const c10::Error& e) {
      ++raised;  // the root's own sharded parameters (pos) fail on shape first
      std::cout << "shape error: " << e.what() << std::endl;
    }
  }
  EXPECT_EQ(raised, 2);
  destroy_process_group();
}

TEST(FSDPBypass, Raises) {
  for (int world : {1, 2}) {
    tdist::testing::expect_all_ok(tdist::testing::run_ranks_as_processes("fsdp_bypass", world));
  }
}

// Note [Same model on every rank]: the last rank builds a different model or passes other
// options; the fully_shard call where they first differ raises InvalidArgument on every rank,
// naming that rank and what differs, before any collective of FSDP's own (TDIST_DIFFER:
// hidden = a wider MLP, blocks = one more block, dtype = another param_dtype, hsdp = a wider
// MLP under a (world, 1) mesh, where only the replicas compare).
TDIST_SCENARIO(fsdp_models_differ) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank(), last = get_world_size() - 1;
  const std::string differ = tdist::testing::env_str("TDIST_DIFFER");
  TinyConfig c = testing::uneven_tiny_config();
  FullyShardOptions options;
  if (differ == "hsdp") {
    options.mesh(mesh::init_device_mesh("cpu", {get_world_size(), 1}, {"replicate", "shard"}));
  }
  if (rank == last) {
    if (differ == "hidden" || differ == "hsdp") c.hidden += 2;
    if (differ == "blocks") c.blocks += 1;
    if (differ == "dtype") options.mp_policy(MixedPrecisionPolicy().param_dtype(torch::kBFloat16));
  }
  const std::string expected = differ == "blocks"  ? "has module "
                               : differ == "dtype" ? "options param_dtype=BFloat16"
                                                   : "parameter 'fc1.weight' [23, 15] Float";
  TinyTransformer model = testing::make_tiny(c);
  try {
    for (auto& block : model->blocks) fully_shard(block, options);
    fully_shard(model, options);
    ADD_FAILURE() << "rank " << rank << ": no error for models that differ (" << differ << ")";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the ranks built different models"), std::string::npos) << what;
    EXPECT_NE(
        what.find("rank " + std::to_string(last) + " has " + (differ == "blocks" ? "" : expected)),
        std::string::npos)
        << what;
    EXPECT_NE(what.find(expected), std::string::npos) << what;
  }
  destroy_process_group();
}

// Parameters of several dtypes under one fully_shard call would be gathered in the first
// one's dtype: float64 through float32, complex through real. The call is refused; split by
// dtype (one call per child) or ignored, they keep every bit.
struct OneDtypeImpl : torch::nn::Module {
  explicit OneDtypeImpl(at::Tensor value) { p = register_parameter("p", std::move(value)); }
  at::Tensor forward(const at::Tensor&) { return p.clone(); }
  at::Tensor p;
};
TORCH_MODULE(OneDtype);

struct MixedDtypesImpl : torch::nn::Module {
  MixedDtypesImpl() {
    single = register_module("single", OneDtype(torch::full({5}, 0.25, torch::kFloat)));
    precise = register_module("precise", OneDtype(torch::full({7}, 1.0 + 1e-12, torch::kDouble)));
    complex = register_module("complex", OneDtype(torch::full({3}, c10::complex<double>(0.5, 2.0),
                                                              torch::kComplexDouble)));
  }
  /// The children through fsdp::forward when each was sharded on its own.
  at::Tensor value_of(OneDtype& child, const at::Tensor& x) {
    return children_sharded ? tdist::fsdp::forward(child, x) : child->forward(x);
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor single_p = value_of(single, x), precise_p = value_of(precise, x),
               complex_p = value_of(complex, x);
    seen_precise = precise_p.detach();
    seen_complex = complex_p.detach();
    return (x * single_p.sum()).sum().to(torch::kDouble) + precise_p.sum() + complex_p.abs().sum();
  }
  OneDtype single{nullptr}, precise{nullptr}, complex{nullptr};
  bool children_sharded = false;
  at::Tensor seen_precise, seen_complex;
};
TORCH_MODULE(MixedDtypes);

void expect_every_bit_kept(MixedDtypes& model) {
  tdist::fsdp::forward(model, torch::ones({2})).backward();
  EXPECT_TRUE(torch::equal(model->seen_precise, torch::full({7}, 1.0 + 1e-12, torch::kDouble)));
  EXPECT_TRUE(torch::equal(model->seen_complex,
                           torch::full({3}, c10::complex<double>(0.5, 2.0), torch::kComplexDouble)))
      << model->seen_complex;
}

TDIST_SCENARIO(fsdp_mixed_dtypes) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  {
    MixedDtypes model;
    try {
      fully_shard(model);
      ADD_FAILURE() << "one fully_shard call over Float, Double and ComplexDouble was accepted";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("parameter 'precise.p' is Double but 'single.p' is Float"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("call fully_shard on submodules"), std::string::npos) << what;
    }
  }
  {
    MixedDtypes model;
    for (auto child : {model->single.ptr(), model->precise.ptr(), model->complex.ptr()}) {
      fully_shard(child);
    }
    fully_shard(model);
    model->children_sharded = true;
    expect_every_bit_kept(model);
  }
  {
    MixedDtypes model;
    fully_shard(model, FullyShardOptions().ignored_params({model->precise->p, model->complex->p}));
    expect_every_bit_kept(model);
  }
  destroy_process_group();
}

TEST(FSDPMixedDtypes, OneCallRefusesThemAndSplitCallsKeepEveryBit) {
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("fsdp_mixed_dtypes", world));
  }
}

TEST(FSDPModelsDiffer, EveryRankRaisesNamingTheRankAndParameter) {
  for (const char* differ : {"hidden", "blocks", "dtype", "hsdp"}) {
    for (int world : {2, 3}) {
      SCOPED_TRACE(std::string(differ) + " at world " + std::to_string(world));
      tdist::testing::ProcessOptions options;
      options.env = {{"TDIST_DIFFER", differ}};
      tdist::testing::expect_all_ok(
          tdist::testing::run_ranks_as_processes("fsdp_models_differ", world, options));
    }
  }
}

}  // namespace
}  // namespace tdist::fsdp

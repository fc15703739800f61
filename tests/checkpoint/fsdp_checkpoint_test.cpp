// tdist::checkpoint's module adapters with FSDP (fully_shard) and DDP modules: a checkpoint
// saved from FSDP at world N loads into FSDP, DDP or a plain single-process model at world M
// with parameters and AdamW state bitwise equal to the saved full state; loading at the same
// world resumes training bitwise. Ranks are processes; the model has uneven shapes (7 rows).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "fsdp/tiny_transformer.h"
#include "support/ranks.h"
#include "support/tensors.h"
#include "tdist/checkpoint/checkpoint_manager.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/checkpoint/metadata.h"
#include "tdist/checkpoint/module_state.h"
#include "tdist/checkpoint/sharded_safetensors.h"
#include "tdist/comm/distributed.h"
#include "tdist/ddp/distributed_data_parallel.h"
#include "tdist/error.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/state_dict.h"

namespace tdist::checkpoint {
namespace {

using fsdp::testing::TinyConfig;
using fsdp::testing::TinyTransformer;

constexpr int64_t kLocalBatch = 2;
constexpr int kTrainSteps = 3;

using tdist::testing::bitwise_equal;
using tdist::testing::env_str;

TinyConfig config() {
  return fsdp::testing::uneven_tiny_config();
}

TinyTransformer make_model(uint64_t seed) {
  TinyTransformer m = fsdp::testing::make_tiny(config(), seed);
  m->register_buffer("scale", torch::arange(3, torch::kFloat) + static_cast<double>(seed));
  return m;
}

std::unique_ptr<torch::optim::AdamW> make_adamw(TinyTransformer& m) {
  return std::make_unique<torch::optim::AdamW>(m->parameters(),
                                               torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
}

void shard(TinyTransformer& m) {
  for (auto& block : m->blocks) fsdp::fully_shard(block);
  fsdp::fully_shard(m);
}

double train_step(TinyTransformer& m, torch::optim::Optimizer& opt, int step) {
  const int world = get_world_size(), rank = get_rank();
  auto [inputs, targets] = fsdp::testing::tiny_batch(config(), kLocalBatch * world, step);
  opt.zero_grad();
  auto loss =
      fsdp::testing::lm_loss(fsdp::forward(m, inputs.narrow(0, rank * kLocalBatch, kLocalBatch)),
                             targets.narrow(0, rank * kLocalBatch, kLocalBatch));
  loss.backward();
  opt.step();
  auto global = torch::tensor({loss.item<double>()}, torch::kFloat64);
  all_reduce(global);
  return global.item<double>() / world;
}

/// Expects `got` (whole tensors) to equal the reference checkpoint's `prefix` tensors.
void expect_matches_reference(const std::map<std::string, at::Tensor>& got,
                              const std::string& prefix, const std::string& what) {
  const TensorMap ref = read_full_tensors(env_str("CK_DIR") + "/ref", prefix);
  ASSERT_GT(ref.size(), 0u);
  EXPECT_EQ(got.size(), ref.size()) << what << " " << prefix;
  for (const auto& [name, t] : ref) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << what << ": " << prefix << name << " not loaded";
    EXPECT_TRUE(bitwise_equal(it->second, t)) << what << ": " << prefix << name;
  }
}

std::map<std::string, at::Tensor> locals(const ShardedStateDict& state) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, st] : state) out[name] = st.local;
  return out;
}

/// Model and optimizer full state of any (sharded or not) model vs the reference.
void expect_state_matches_reference(const torch::nn::Module& m, torch::optim::Optimizer& opt,
                                    const std::string& what) {
  const auto full = fsdp::StateDictOptions().full_state_dict(true);
  expect_matches_reference(locals(fsdp::get_model_state_dict(m, full)), kModelPrefix, what);
  expect_matches_reference(locals(fsdp::get_optimizer_state_dict(m, opt, full)), kOptimPrefix,
                           what);
}

// Saves an FSDP model after kTrainSteps at this world size into CK_DIR/ckpt, rank 0 the full
// reference state into CK_DIR/ref, then trains one more step and rank 0 records its loss.
TDIST_SCENARIO(ck_fsdp_save) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("CK_DIR");
  TinyTransformer m = make_model(1234);
  shard(m);
  auto opt = make_adamw(m);
  for (int s = 0; s < kTrainSteps; ++s) train_step(m, *opt, s);
  ExtraState extra;
  extra.step = kTrainSteps;
  save_module(*m, opt.get(), extra, dir + "/ckpt", SaveOptions().fsync(false));

  const auto r0 = fsdp::StateDictOptions().full_state_dict(true).cpu_offload(true);  // rank 0's
  ShardedStateDict ref;
  for (auto& [name, st] : fsdp::get_model_state_dict(*m, r0)) ref[kModelPrefix + name] = st;
  for (auto& [name, st] : fsdp::get_optimizer_state_dict(*m, *opt, r0)) {
    ref[kOptimPrefix + name] = st;
  }
  if (get_rank() == 0) {
    save(ref, {}, dir + "/ref",
         SaveOptions().coordinator(std::make_shared<LocalCoordinator>()).fsync(false));
  }
  const double loss = train_step(m, *opt, kTrainSteps);
  if (get_rank() == 0) std::ofstream(dir + "/loss.txt") << std::hexfloat << loss << "\n";
  destroy_process_group();
}

// Loads CK_DIR/ckpt into a fresh FSDP model (CK_MODE=fsdp) or DDP model (ddp) at this world
// size and compares with the reference; CK_RESUME=1: the next step's loss is the saved one.
TDIST_SCENARIO(ck_load) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("CK_DIR");
  TinyTransformer m = make_model(999);
  std::unique_ptr<ddp::DistributedDataParallel<TinyTransformer>> ddp;
  if (env_str("CK_MODE") == "ddp") {
    ddp = std::make_unique<ddp::DistributedDataParallel<TinyTransformer>>(m);
  } else {
    shard(m);
  }
  auto opt = make_adamw(m);
  const LoadResult r =
      ddp ? load_module(*ddp, opt.get(), dir + "/ckpt") : load_module(*m, opt.get(), dir + "/ckpt");
  EXPECT_EQ(r.extra.step, kTrainSteps);
  EXPECT_TRUE(r.unexpected_keys.empty());
  expect_state_matches_reference(*m, *opt,
                                 env_str("CK_MODE") + " rank " + std::to_string(get_rank()));
  if (env_str("CK_RESUME") == "1") {
    std::ifstream in(dir + "/loss.txt");
    std::string text;
    in >> text;
    const double saved = std::strtod(text.c_str(), nullptr);
    EXPECT_EQ(train_step(m, *opt, kTrainSteps), saved) << "rank " << get_rank();
  }
  destroy_process_group();
}

void save_at(const std::string& dir, int world) {
  tdist::testing::ProcessOptions options;
  options.env = {{"CK_DIR", dir}};
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("ck_fsdp_save", world, options));
}

void load_at(const std::string& dir, int world, const std::string& mode, bool resume) {
  SCOPED_TRACE("load " + mode + " at world " + std::to_string(world));
  tdist::testing::ProcessOptions options;
  options.env = {{"CK_DIR", dir}, {"CK_MODE", mode}, {"CK_RESUME", resume ? "1" : "0"}};
  tdist::testing::expect_all_ok(tdist::testing::run_ranks_as_processes("ck_load", world, options));
}

/// Loads into a plain model and optimizer in this (single, uninitialised) process.
void load_plain(const std::string& dir) {
  SCOPED_TRACE("load plain single-process");
  ::setenv("CK_DIR", dir.c_str(), 1);
  TinyTransformer m = make_model(999);
  auto opt = make_adamw(m);
  const LoadResult r = load_module(*m, opt.get(), dir + "/ckpt");
  EXPECT_EQ(r.extra.step, kTrainSteps);
  expect_state_matches_reference(*m, *opt, "plain");
  // The plain interchange view is the same full state.
  expect_matches_reference(module_tensors(*m), kModelPrefix, "module_tensors");
}

TEST(FSDPCheckpoint, SavedAtTwoLoadsAtThreeIntoPlainAndResumesAtTwo) {
  const std::string dir = tdist::testing::make_temp_dir("ckpt-fsdp");
  save_at(dir, 2);
  load_at(dir, 3, "fsdp", false);
  load_plain(dir);
  load_at(dir, 2, "fsdp", true);
}

TEST(FSDPCheckpoint, SavedAtThreeLoadsIntoDDPAtTwoAndFSDPAtFour) {
  const std::string dir = tdist::testing::make_temp_dir("ckpt-fsdp");
  save_at(dir, 3);
  load_at(dir, 2, "ddp", false);
  load_at(dir, 4, "fsdp", false);
  load_at(dir, 3, "fsdp", true);
}

TEST(FSDPCheckpoint, SavedAtFourLoadsAtOne) {
  const std::string dir = tdist::testing::make_temp_dir("ckpt-fsdp");
  save_at(dir, 4);
  load_at(dir, 1, "fsdp", false);
  load_plain(dir);
}

// A learnable scalar (a 0-dim parameter) through FSDP's save at several world sizes: the
// checkpoint describes it, and its optimizer state, as float32 scalars (no rank owns "rows"
// of it), read_full_tensors returns scalars, and it loads back into FSDP and plain models.
struct ScaledImpl : torch::nn::Module {
  ScaledImpl() {
    linear = register_module("linear", torch::nn::Linear(5, 7));
    scale = register_parameter("scale", torch::tensor(1.5));
  }
  at::Tensor forward(const at::Tensor& x) { return linear->forward(x) * scale; }
  torch::nn::Linear linear{nullptr};
  at::Tensor scale;
};
TORCH_MODULE(Scaled);

Scaled make_scaled(uint64_t seed) {
  torch::manual_seed(seed);
  return Scaled();
}

void scaled_step(Scaled& m, torch::optim::Optimizer& opt) {
  torch::manual_seed(77);
  at::Tensor x = torch::randn({6, 5});
  opt.zero_grad();
  fsdp::forward(m, x).pow(2).mean().backward();
  opt.step();
}

TDIST_SCENARIO(ck_scalar_param) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("CK_DIR");
  Scaled m = make_scaled(5);
  fsdp::fully_shard(m);
  auto opt =
      std::make_unique<torch::optim::AdamW>(m->parameters(), torch::optim::AdamWOptions(0.1));
  scaled_step(m, *opt);
  if (env_str("CK_MODE") == "save") {
    save_module(*m, opt.get(), {}, dir + "/ckpt", SaveOptions().fsync(false));
    const auto full = fsdp::StateDictOptions().full_state_dict(true);
    auto model = fsdp::get_model_state_dict(*m, full);
    auto optim = fsdp::get_optimizer_state_dict(*m, *opt, full);
    if (get_rank() == 0) {
      torch::save(model.at("scale").local, dir + "/scale.pt");
      torch::save(optim.at("scale.exp_avg").local, dir + "/exp_avg.pt");
    }
  } else {
    load_module(*m, opt.get(), dir + "/ckpt");
    const auto full = fsdp::StateDictOptions().full_state_dict(true);
    at::Tensor scale = fsdp::get_model_state_dict(*m, full).at("scale").local;
    at::Tensor exp_avg = fsdp::get_optimizer_state_dict(*m, *opt, full).at("scale.exp_avg").local;
    at::Tensor want_scale, want_exp_avg;
    torch::load(want_scale, dir + "/scale.pt");
    torch::load(want_exp_avg, dir + "/exp_avg.pt");
    EXPECT_TRUE(bitwise_equal(scale, want_scale)) << scale << " vs " << want_scale;
    EXPECT_TRUE(bitwise_equal(exp_avg, want_exp_avg)) << exp_avg << " vs " << want_exp_avg;
  }
  destroy_process_group();
}

TEST(FSDPCheckpoint, AScalarParameterIsSavedAsAScalarAtWorlds1To3) {
  for (int save_world : {1, 2, 3}) {
    SCOPED_TRACE("saved at world " + std::to_string(save_world));
    const std::string dir = tdist::testing::make_temp_dir("ckpt-scalar");
    tdist::testing::ProcessOptions options;
    options.env = {{"CK_DIR", dir}, {"CK_MODE", "save"}};
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("ck_scalar_param", save_world, options));
    const CheckpointMetadata meta = read_metadata(dir + "/ckpt");
    for (const char* key :
         {"model.scale", "optim.state.scale.exp_avg", "optim.state.scale.exp_avg_sq"}) {
      ASSERT_TRUE(meta.tensors.count(key)) << key;
      EXPECT_EQ(meta.tensors.at(key).dtype, "F32") << key;
      EXPECT_TRUE(meta.tensors.at(key).global_shape.empty()) << key;
    }
    const TensorMap full = read_full_tensors(dir + "/ckpt");
    at::Tensor want;
    torch::load(want, dir + "/scale.pt");
    ASSERT_TRUE(full.count("model.scale"));
    EXPECT_TRUE(bitwise_equal(full.at("model.scale"), want)) << full.at("model.scale");
    // And through both export formats.
    export_torch_file(full, dir + "/export.pt");
    EXPECT_TRUE(bitwise_equal(import_torch_file(dir + "/export.pt").at("model.scale"), want));
    save_safetensors(full, dir + "/export.safetensors");
    EXPECT_TRUE(
        bitwise_equal(load_safetensors(dir + "/export.safetensors").at("model.scale"), want));
    // And through the command line tool, the model's names alone.
    const std::string cli = std::string(CKPT_INSPECT_BIN) + " --export " + dir + "/ckpt pt " + dir +
                            "/cli.pt model. >/dev/null";
    ASSERT_EQ(std::system(cli.c_str()), 0) << cli;
    const TensorMap exported = import_torch_file(dir + "/cli.pt");
    EXPECT_EQ(exported.size(), 3u);
    EXPECT_TRUE(bitwise_equal(exported.at("scale"), want));
    for (int load_world : {1, 2, 3}) {
      SCOPED_TRACE("loaded at world " + std::to_string(load_world));
      options.env["CK_MODE"] = "load";
      tdist::testing::expect_all_ok(
          tdist::testing::run_ranks_as_processes("ck_scalar_param", load_world, options));
    }
    // A plain model reads it back too.
    Scaled plain = make_scaled(9);
    auto opt =
        std::make_unique<torch::optim::AdamW>(plain->parameters(), torch::optim::AdamWOptions(0.1));
    scaled_step(plain, *opt);
    load_module(*plain, opt.get(), dir + "/ckpt");
    EXPECT_TRUE(bitwise_equal(plain->scale.detach(), want)) << plain->scale;
  }
}

// Sharded safetensors (Hugging Face's layout), written in parallel by 3 ranks and loaded into
// an FSDP model at the same world.
TDIST_SCENARIO(ck_sharded_safetensors) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("CK_DIR");
  TinyTransformer source = make_model(1234);
  const TensorMap tensors = module_tensors(*source);
  int64_t total = 0;
  for (const auto& [name, t] : tensors) total += t.nbytes();
  save_safetensors_sharded(tensors, dir + "/st",
                           ShardedSafetensorsOptions().max_shard_bytes(total / 4).parallel(true));
  TinyTransformer m = make_model(999);
  shard(m);
  load_module_tensors(*m, load_safetensors_sharded(dir + "/st"));
  const TensorMap got = module_tensors(*m);  // collective: gathers the shards
  EXPECT_EQ(got.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(bitwise_equal(got.at(name), t)) << name;
  }
  destroy_process_group();
}

TEST(ShardedSafetensors, WrittenInParallelAtWorld3AndLoadedIntoFSDP) {
  const std::string dir = tdist::testing::make_temp_dir("ckpt-st");
  tdist::testing::ProcessOptions options;
  options.env = {{"CK_DIR", dir}};
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("ck_sharded_safetensors", 3, options));
  const TensorMap want = module_tensors(*make_model(1234));
  const TensorMap got = load_safetensors_sharded(dir + "/st");
  EXPECT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) EXPECT_TRUE(bitwise_equal(got.at(name), t)) << name;
  EXPECT_TRUE(std::filesystem::exists(dir + "/st/model.safetensors.index.json"));
}

TEST(ShardedSafetensors, HuggingFacesLayoutAndIndex) {
  const std::string dir = tdist::testing::make_temp_dir("ckpt-st");
  TensorMap tensors{{"a", torch::arange(100, torch::kFloat)},     // 400 bytes
                    {"b", torch::arange(10, torch::kLong)},       // 80
                    {"c", torch::ones({300}, torch::kBFloat16)},  // 600: more than the limit
                    {"d", torch::tensor(2.5)}};                   // a scalar
  const auto files =
      save_safetensors_sharded(tensors, dir, ShardedSafetensorsOptions().max_shard_bytes(500));
  // a+b fit 500 bytes; c is alone (over the limit); d follows in a shard of its own.
  const std::vector<std::string> want_files = {
      dir + "/model-00001-of-00003.safetensors", dir + "/model-00002-of-00003.safetensors",
      dir + "/model-00003-of-00003.safetensors", dir + "/model.safetensors.index.json"};
  EXPECT_EQ(files, want_files);
  std::ifstream in(dir + "/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), 400 + 80 + 600 + 4);
  EXPECT_EQ(index["weight_map"]["a"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["b"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["c"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["d"], "model-00003-of-00003.safetensors");
  const TensorMap back = load_safetensors_sharded(dir);
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(bitwise_equal(back.at(name), t)) << name;
  // One shard: the single file, no index.
  const std::string one = tdist::testing::make_temp_dir("ckpt-st");
  EXPECT_EQ(save_safetensors_sharded(tensors, one),
            std::vector<std::string>{one + "/model.safetensors"});
  EXPECT_TRUE(bitwise_equal(load_safetensors_sharded(one).at("c"), tensors.at("c")));
}

TEST(ShardedSafetensors, AMissingOrWrongShardIsNamed) {
  const std::string dir = tdist::testing::make_temp_dir("ckpt-st");
  TensorMap tensors{{"a", torch::ones({100})}, {"b", torch::ones({100})}};
  save_safetensors_sharded(tensors, dir, ShardedSafetensorsOptions().max_shard_bytes(400));
  std::filesystem::rename(dir + "/model-00002-of-00002.safetensors", dir + "/moved");
  try {
    load_safetensors_sharded(dir);
    FAIL() << "loaded with a shard missing";
  } catch (const tdist::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00002.safetensors', which is missing"),
              std::string::npos)
        << e.what();
  }
  // The index says b is in shard 1, which does not hold it.
  std::filesystem::rename(dir + "/moved", dir + "/model-00002-of-00002.safetensors");
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00001-of-00002.safetensors"}})";
  try {
    load_safetensors_sharded(dir);
    FAIL() << "loaded a tensor from the wrong shard";
  } catch (const tdist::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_safetensors_sharded(tdist::testing::make_temp_dir("ckpt-st")),
               tdist::CheckpointError);
}

// The CheckpointManager forms of the module adapter (single process, plain model).
TEST(FSDPCheckpoint, ManagerSavesAndLoadsLatestModule) {
  const std::string root = tdist::testing::make_temp_dir("ckpt-manager");
  CheckpointManager manager(
      root, CheckpointManagerOptions().keep_last(2).save_options(SaveOptions().fsync(false)));
  TinyTransformer m = make_model(1234);
  auto opt = make_adamw(m);
  auto step = [&](TinyTransformer& model, torch::optim::Optimizer& o, int s) {
    auto [x, y] = fsdp::testing::tiny_batch(config(), kLocalBatch, s);
    o.zero_grad();
    fsdp::testing::lm_loss(model->forward(x), y).backward();
    o.step();
  };
  for (int s = 0; s < 3; ++s) {
    step(m, *opt, s);
    ExtraState extra;
    extra.step = s;
    save_module(manager, s, *m, opt.get(), extra);
  }
  EXPECT_EQ(manager.list().size(), 2u);
  TinyTransformer fresh = make_model(999);
  auto fresh_opt = make_adamw(fresh);
  auto r = load_latest_module(manager, *fresh, fresh_opt.get());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->extra.step, 2);
  step(m, *opt, 3);
  step(fresh, *fresh_opt, 3);
  const TensorMap a = module_tensors(*m), b = module_tensors(*fresh);
  for (const auto& [name, t] : a) EXPECT_TRUE(bitwise_equal(t, b.at(name))) << name;
}

}  // namespace
}  // namespace tdist::checkpoint

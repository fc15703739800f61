// Training on a GPU: FSDP (fp32, bf16 mixed precision, CPU offload), DDP and distributed
// checkpoints on CUDA models, each against single-process training of the same model on the
// same GPU (and activation checkpointing's replay of the CUDA RNG); world 1 over NCCL and worlds 2
// (and 3 for checkpoints) over Gloo on one shared GPU (NCCL refuses two ranks on one GPU). Without
// a GPU every CUDA case skips with the reason. The same scenarios also run on CPU
// (TrainOnDevice.CpuBaseline) so that what the CUDA cases assert is itself checked on every
// machine.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include "fsdp/tiny_transformer.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/checkpoint/checkpoint.h"
#include "tdist/checkpoint/coordinator.h"
#include "tdist/checkpoint/extra_state.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/checkpoint/module_state.h"
#include "tdist/comm/distributed.h"
#include "tdist/ddp/distributed_data_parallel.h"
#include "tdist/fsdp/activation_checkpoint.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/full_params.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/state_dict.h"

namespace tdist::testing {
namespace {

using fsdp::testing::TinyConfig;
using fsdp::testing::TinyTransformer;

constexpr int64_t kLocalBatch = 2;
constexpr int kSteps = 6;
// fp32 on one GPU: the sharded run and the reference differ only in how the batch is split
// (rows per kernel) and in the order of the gradient sum; after kSteps AdamW steps that is
// rounding-sized.
constexpr double kFp32Tol = 2e-5;
// bf16 parameters keep 8 significant bits (relative rounding 2^-9 per value): losses of the
// tiny model (~3.1) drift from fp32 by well under 2% over kSteps steps at lr 1e-2, while
// dropped or garbage gradients move them by far more.
constexpr double kBf16RelTol = 0.02;

// TC_DEVICE ("cuda" / "cpu") and TC_BACKEND ("nccl": cpu:gloo,cuda:nccl on cuda:0;
// "nccl_alone": nccl with no CPU backend, as most PyTorch jobs run; "gloo").
c10::Device device() {
  return env_str("TC_DEVICE", "cuda") == "cuda" ? c10::Device(c10::kCUDA, 0)
                                                : c10::Device(c10::kCPU);
}

void init() {
  auto options = InitProcessGroupOptions().timeout(std::chrono::seconds(120));
  const std::string backend = env_str("TC_BACKEND", "gloo");
  if (backend == "nccl") {
    options.backend("cpu:gloo,cuda:nccl").device_id("cuda:0");
  } else if (backend == "nccl_alone") {
    options.backend("nccl").device_id("cuda:0");
  } else {
    options.backend("gloo");
  }
  init_process_group(options);
}

TinyTransformer model_on_device(uint64_t seed = 1234) {
  TinyTransformer m = fsdp::testing::make_tiny(fsdp::testing::uneven_tiny_config(), seed);
  m->to(device());
  return m;
}

torch::optim::AdamW make_adamw(TinyTransformer& m) {
  return torch::optim::AdamW(m->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
}

std::pair<at::Tensor, at::Tensor> global_batch(int step) {
  auto [x, y] = fsdp::testing::tiny_batch(fsdp::testing::uneven_tiny_config(),
                                          kLocalBatch * get_world_size(), step);
  return {x.to(device()), y.to(device())};
}

at::Tensor rows_of_rank(const at::Tensor& t) {
  return t.narrow(0, get_rank() * kLocalBatch, kLocalBatch);
}

double global_mean(double local) {
  auto t = to_collective_device(torch::tensor({local}, torch::kFloat64));
  all_reduce(t);
  return t.item<double>() / get_world_size();
}

/// One step of the single-process reference on the whole global batch; returns its loss.
double reference_step(TinyTransformer& ref, torch::optim::Optimizer& opt, const at::Tensor& x,
                      const at::Tensor& y) {
  opt.zero_grad();
  auto loss = fsdp::testing::lm_loss(ref->forward(x), y);
  loss.backward();
  opt.step();
  return loss.item<double>();
}

/// Max |a - b| over the full parameters of `model` (FSDP or plain) and `ref`.
double max_param_diff(TinyTransformer& model, TinyTransformer& ref, bool sharded) {
  std::optional<fsdp::SummonFullParams> full;
  if (sharded) full.emplace(*model, fsdp::SummonFullParamsOptions().writeback(false));
  auto ref_params = ref->named_parameters();
  double diff = 0;
  for (const auto& item : model->named_parameters()) {
    const at::Tensor& want = ref_params[item.key()];
    EXPECT_EQ(item.value().sizes(), want.sizes()) << item.key();
    if (item.value().sizes() != want.sizes()) return 1e9;
    diff = std::max(diff, (item.value().to(want.device()) - want).abs().max().item<double>());
  }
  return diff;
}

// TC_MODE: fp32 | bf16 | offload. FSDP block by block and at the root against the reference
// on the whole global batch, every step's loss, then the parameters.
TDIST_SCENARIO(tc_fsdp) {
  init();
  const std::string mode = env_str("TC_MODE", "fp32");
  TinyTransformer ref = model_on_device();
  TinyTransformer model = model_on_device();
  auto ref_opt = make_adamw(ref);
  fsdp::FullyShardOptions options;
  fsdp::FullyShardOptions root_options;
  if (mode == "bf16") {
    const auto bf16 =
        fsdp::MixedPrecisionPolicy().param_dtype(torch::kBFloat16).reduce_dtype(torch::kFloat);
    options.mp_policy(bf16);
    // The blocks hand bf16 activations on; the root's logits come out in fp32.
    root_options.mp_policy(fsdp::MixedPrecisionPolicy(bf16).output_dtype(torch::kFloat));
  } else if (mode == "offload") {
    options.offload_policy(fsdp::CPUOffloadPolicy(/*pin_memory=*/true));
    root_options = options;
  }
  for (auto& block : model->blocks) fsdp::fully_shard(block, options);
  fsdp::fully_shard(model, root_options);
  auto opt = make_adamw(model);
  // Sharded parameters at rest: on the host with offload, else on the model's device.
  const c10::Device shard_device = mode == "offload" ? c10::Device(c10::kCPU) : device();
  for (const auto& p : model->parameters()) EXPECT_EQ(p.device(), shard_device);
  const double loss_tol = mode == "bf16" ? kBf16RelTol : kFp32Tol;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(step);
    const double want = reference_step(ref, ref_opt, x, y);
    opt.zero_grad();
    auto loss = fsdp::testing::lm_loss(fsdp::forward(model, rows_of_rank(x)), rows_of_rank(y));
    loss.backward();
    for (const auto& p : model->parameters()) {
      ASSERT_TRUE(p.grad().defined());
      EXPECT_EQ(p.grad().device(), shard_device);
    }
    opt.step();
    EXPECT_NEAR(global_mean(loss.item<double>()), want, loss_tol * std::max(1.0, std::abs(want)))
        << mode << " step " << step;
  }
  const double param_tol = mode == "bf16" ? kBf16RelTol * 10 : kFp32Tol;
  EXPECT_LE(max_param_diff(model, ref, /*sharded=*/true), param_tol)
      << mode << " rank " << get_rank();
  destroy_process_group();
}

TDIST_SCENARIO(tc_ddp) {
  init();
  TinyTransformer ref = model_on_device();
  TinyTransformer model = model_on_device();
  auto ref_opt = make_adamw(ref);
  ddp::DistributedDataParallel ddp(model);
  auto opt = make_adamw(model);
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(step);
    const double want = reference_step(ref, ref_opt, x, y);
    opt.zero_grad();
    auto out = ddp.forward(rows_of_rank(x));
    auto loss = fsdp::testing::lm_loss(out, rows_of_rank(y));
    loss.backward();
    for (const auto& p : model->parameters()) EXPECT_EQ(p.grad().device(), device());
    opt.step();
    EXPECT_NEAR(global_mean(loss.item<double>()), want, kFp32Tol * std::max(1.0, std::abs(want)))
        << "step " << step;
  }
  EXPECT_LE(max_param_diff(model, ref, /*sharded=*/false), kFp32Tol) << "rank " << get_rank();
  destroy_process_group();
}

// ---- checkpoints: saved on one device and world, loaded on another -------------------------

std::map<std::string, at::Tensor> full_state(TinyTransformer& m, torch::optim::Optimizer& opt) {
  // On every rank (cpu_offload would return it on rank 0 only), then on the host.
  const auto full = fsdp::StateDictOptions().full_state_dict(true);
  std::map<std::string, at::Tensor> out;
  for (auto& [name, st] : fsdp::get_model_state_dict(*m, full)) {
    out[checkpoint::kModelPrefix + name] = st.local.cpu();
  }
  for (auto& [name, st] : fsdp::get_optimizer_state_dict(*m, opt, full)) {
    out[checkpoint::kOptimPrefix + name] = st.local.cpu();
  }
  return out;
}

void shard(TinyTransformer& m) {
  for (auto& block : m->blocks) fsdp::fully_shard(block);
  fsdp::fully_shard(m);
}

// CK_DIR/ckpt from an FSDP model trained 3 steps on TC_DEVICE; rank 0 also writes the full
// state (through the host) to CK_DIR/ref.
TDIST_SCENARIO(tc_checkpoint_save) {
  init();
  const std::string dir = env_str("CK_DIR");
  TinyTransformer m = model_on_device();
  shard(m);
  auto opt = make_adamw(m);
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = global_batch(step);
    opt.zero_grad();
    fsdp::testing::lm_loss(fsdp::forward(m, rows_of_rank(x)), rows_of_rank(y)).backward();
    opt.step();
  }
  checkpoint::save_module(*m, &opt, {}, dir + "/ckpt", checkpoint::SaveOptions().fsync(false));
  ShardedStateDict ref;
  for (auto& [name, t] : full_state(m, opt)) ref[name] = ShardedTensor::whole(t);
  if (get_rank() == 0) {
    checkpoint::save(ref, {}, dir + "/ref",
                     checkpoint::SaveOptions()
                         .coordinator(std::make_shared<checkpoint::LocalCoordinator>())
                         .fsync(false));
  }
  destroy_process_group();
}

// Loads CK_FROM into a fresh FSDP model on TC_DEVICE at this world, expects the CK_DIR/ref
// state bitwise (parameters and optimizer state on the parameters' device), and saves it
// again into CK_TO when given.
TDIST_SCENARIO(tc_checkpoint_load) {
  init();
  const std::string dir = env_str("CK_DIR");
  TinyTransformer m = model_on_device(/*seed=*/999);
  shard(m);
  auto opt = make_adamw(m);
  checkpoint::load_module(*m, &opt, env_str("CK_FROM"));
  for (const auto& p : m->parameters()) EXPECT_EQ(p.device(), device());
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      auto it = opt.state().find(p.unsafeGetTensorImpl());
      ASSERT_NE(it, opt.state().end());
      const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      EXPECT_EQ(adam.exp_avg().device(), p.device());
      EXPECT_EQ(adam.exp_avg_sq().device(), p.device());
    }
  }
  const checkpoint::TensorMap want = checkpoint::read_full_tensors(dir + "/ref");
  const auto got = full_state(m, opt);
  ASSERT_GT(want.size(), 0u);
  EXPECT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name << " not loaded";
    EXPECT_TRUE(it->second.cpu().equal(t)) << name << " on rank " << get_rank();
  }
  const std::string to = env_str("CK_TO");
  if (!to.empty()) {
    checkpoint::save_module(*m, &opt, {}, to, checkpoint::SaveOptions().fsync(false));
  }
  destroy_process_group();
}

// ---- the cases -------------------------------------------------------------------------------

void run(const std::string& scenario, int world, std::map<std::string, std::string> env) {
  SCOPED_TRACE(scenario + " at world " + std::to_string(world) + " (" + env["TC_DEVICE"] + ", " +
               env["TC_BACKEND"] + (env.count("TC_MODE") ? ", " + env["TC_MODE"] : "") + ")");
  ProcessOptions options;
  options.env = std::move(env);
  options.timeout = std::chrono::seconds(240);
  expect_all_ok(run_ranks_as_processes(scenario, world, options));
}

void fsdp_parity(const std::string& device, const std::string& backend, int world) {
  for (const char* mode : {"fp32", "bf16", "offload"}) {
    run("tc_fsdp", world, {{"TC_DEVICE", device}, {"TC_BACKEND", backend}, {"TC_MODE", mode}});
  }
}

// CUDA (world 2) -> CPU (world 3) -> CUDA (world 2), or the CPU-only chain on CPU.
void checkpoint_round_trip(const std::string& device) {
  const std::string dir = make_temp_dir("tdist-train-cuda");
  const std::map<std::string, std::string> on_device = {
      {"TC_DEVICE", device}, {"TC_BACKEND", "gloo"}, {"CK_DIR", dir}};
  auto with = [&](std::map<std::string, std::string> env,
                  std::map<std::string, std::string> extra) {
    for (auto& [k, v] : extra) env[k] = v;
    return env;
  };
  run("tc_checkpoint_save", 2, on_device);
  run("tc_checkpoint_load", 3,
      with(on_device, {{"TC_DEVICE", "cpu"}, {"CK_FROM", dir + "/ckpt"}, {"CK_TO", dir + "/cpu"}}));
  run("tc_checkpoint_load", 2, with(on_device, {{"CK_FROM", dir + "/cpu"}}));
}

class TrainOnCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_gpu()) GTEST_SKIP() << "needs a CUDA GPU; none here";
  }
};

TEST_F(TrainOnCuda, FsdpParityAtWorld1OverNccl) {
  fsdp_parity("cuda", "nccl", 1);
}

TEST_F(TrainOnCuda, FsdpParityAtWorld2OverGlooOnOneGpu) {
  fsdp_parity("cuda", "gloo", 2);
}

TEST_F(TrainOnCuda, DdpParity) {
  run("tc_ddp", 1, {{"TC_DEVICE", "cuda"}, {"TC_BACKEND", "nccl"}});
  // The library's own flags and counts (buffer agreement, unused-parameter map) with no
  // CPU backend to fall back on.
  run("tc_ddp", 1, {{"TC_DEVICE", "cuda"}, {"TC_BACKEND", "nccl_alone"}});
  run("tc_ddp", 2, {{"TC_DEVICE", "cuda"}, {"TC_BACKEND", "gloo"}});
}

TEST_F(TrainOnCuda, CheckpointCudaToCpuToCuda) {
  checkpoint_round_trip("cuda");
}

// Activation checkpointing on CUDA: the recompute replays the forward's dropout mask, which
// the CUDA generator drew (the CPU's is not enough; ActivationCheckpoint.RecomputeReplays-
// Randomness checks the CPU case).
TEST_F(TrainOnCuda, CheckpointRecomputeReplaysCudaRandomness) {
  torch::nn::Dropout dropout(0.5);
  auto x = torch::ones({4096}, torch::TensorOptions().device(torch::kCUDA).requires_grad(true));
  torch::manual_seed(3);
  auto out = fsdp::checkpointed_forward(dropout, x);
  torch::rand({10}, torch::TensorOptions().device(torch::kCUDA));  // the CUDA RNG moves on
  out.sum().backward();
  // Same mask in forward and recompute: the gradient is 2 exactly where the output is.
  EXPECT_TRUE(torch::equal(x.grad().cpu(), out.detach().cpu()));
}

// A resumable run on a GPU saves that GPU's generator too (SaveLoad.RngStateRestores checks
// the CPU's).
TEST_F(TrainOnCuda, GpuRngStateRestores) {
  const c10::Device gpu(c10::kCUDA, 0);
  const std::vector<uint8_t> state = checkpoint::capture_torch_rng_state(gpu);
  const at::Tensor a = torch::randn({8}, torch::TensorOptions().device(gpu)).cpu();
  checkpoint::restore_torch_rng_state(state, gpu);
  EXPECT_TRUE(torch::equal(a, torch::randn({8}, torch::TensorOptions().device(gpu)).cpu()));
  EXPECT_FALSE(torch::equal(a, torch::randn({8}, torch::TensorOptions().device(gpu)).cpu()));
}

// The scenarios above with every tensor on the CPU: the assertions the CUDA cases make are
// checked wherever the suite runs.
TEST(TrainOnDevice, CpuBaseline) {
  fsdp_parity("cpu", "gloo", 2);
  run("tc_ddp", 2, {{"TC_DEVICE", "cpu"}, {"TC_BACKEND", "gloo"}});
  checkpoint_round_trip("cpu");
}

// The CUDA cases need "nccl" registered in this binary, which happens only where it links
// tdist_nccl: a missing link would otherwise show only on a GPU machine.
TEST(TrainOnDevice, NcclIsRegisteredWhereTheBuildHasIt) {
  EXPECT_EQ(is_nccl_available(), TDIST_TEST_BUILD_HAS_NCCL == 1)
      << "this build " << (TDIST_TEST_BUILD_HAS_NCCL ? "has" : "has no") << " NCCL";
}

}  // namespace
}  // namespace tdist::testing

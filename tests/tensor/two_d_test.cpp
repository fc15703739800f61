// 2-D parallelism: tensor parallelism on mesh["tp"] inside FSDP blocks sharded over
// mesh["dp"], against the same model in one process: the losses of three steps with the
// gradient norm clipped across both dimensions (the norms equal too), an SGD step on the
// shards of shards, and the parameters gathered back at the end.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/fsdp/clip_grad.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/mesh/device_mesh.h"
#include "tdist/tensor/parallel/parallelize.h"

namespace {

using namespace tdist::testing;
using namespace tdist::tensor;
using namespace tdist::tensor::parallel;
namespace tp = tdist::tensor::parallel;
using tdist::mesh::DeviceMesh;

int world_size() {
  return env_int("WORLD_SIZE", 1);
}

// A block whose forward calls its Linears through tensor parallelism when they have a style.
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    up = register_module("up", torch::nn::Linear(6, 10));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({10})));
    down = register_module("down", torch::nn::Linear(10, 6));
  }
  at::Tensor forward(const at::Tensor& x) {
    if (style_of(*up) == nullptr) return x + down(torch::gelu(norm(up(x))));
    // up's output is a column shard; the norm needs whole rows, so gather them first.
    const at::Tensor hidden = tp::forward(up, x);
    return x + tp::forward(down, torch::gelu(norm(hidden)));
  }
  torch::nn::Linear up{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear down{nullptr};
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    layers = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < 2; ++i) layers->push_back(Block());
  }
  at::Tensor forward(at::Tensor x, bool sharded) {
    for (const auto& layer : *layers) {
      auto block = std::dynamic_pointer_cast<BlockImpl>(layer);
      x = sharded ? tdist::fsdp::forward(block, x) : block->forward(x);
    }
    return x;
  }
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(Net);

Net make_net() {
  torch::manual_seed(31);
  Net net;
  net->to(torch::kDouble);
  return net;
}

// TDIST_DP ranks of data parallelism, the rest tensor parallelism; TDIST_VARIANT: "" (plain),
// "mixed" (float32 parameters and reduction for a float64 model), "offload" (the CPU
// offload policy), "hsdp" (the dp ranks as HSDP's (replicate, shard) = (dp, 1): a 3-D mesh).
TDIST_SCENARIO(fsdp_over_tensor_parallel) {
  const int64_t dp = env_int("TDIST_DP", 2);
  const std::string variant = env_str("TDIST_VARIANT");
  const bool hsdp = variant == "hsdp";
  const std::string dp_dim = hsdp ? "replicate" : "dp";
  DeviceMesh mesh =
      hsdp ? tdist::mesh::init_device_mesh("cpu", {dp, 1, world_size() / dp},
                                           {"replicate", "shard", "tp"})
           : tdist::mesh::init_device_mesh("cpu", {dp, world_size() / dp}, {"dp", "tp"});
  Net ref = make_net(), net = make_net();
  parallelize_module(
      net.ptr(), mesh["tp"],
      ParallelizePlan{{"layers.*.up", ColwiseParallel().output_layouts(Replicate())},
                      {"layers.*.down", RowwiseParallel().input_layouts(Replicate())}});
  auto options = tdist::fsdp::FullyShardOptions().mesh(
      hsdp ? mesh[std::vector<std::string>{"replicate", "shard"}] : mesh["dp"]);
  if (variant == "mixed") {
    options.mp_policy(
        tdist::fsdp::MixedPrecisionPolicy().param_dtype(torch::kFloat).reduce_dtype(torch::kFloat));
  }
  if (variant == "offload") options.offload_policy(tdist::fsdp::CPUOffloadPolicy(false));
  // tdist's clip scales by a float32 norm (the single process by a float64 one), so the
  // parameters after a clipped step agree to ~1e-8; float32 compute to ~1e-6.
  const double tolerance = variant == "mixed" ? 1e-5 : 1e-7;
  for (const auto& layer : *net->layers) tdist::fsdp::fully_shard(layer, options);
  tdist::fsdp::fully_shard(net.ptr(), options);

  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.05));
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05));
  const int64_t batch = 2 * dp;
  const int64_t dp_rank = mesh.get_local_rank(dp_dim);
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(100 + step);
    const at::Tensor x = torch::randn({batch, 5, 6}, torch::kDouble);
    const at::Tensor target = torch::randn({batch, 5, 6}, torch::kDouble);
    // Each dp rank takes its rows; the tp ranks of one dp rank take the same rows.
    const at::Tensor ref_loss = (ref->forward(x, false) * target).sum() / batch;
    ref_loss.backward();
    const double ref_norm = torch::nn::utils::clip_grad_norm_(ref->parameters(), 0.5);
    ref_opt.step();
    ref_opt.zero_grad();

    const at::Tensor rows = x.narrow(0, 2 * dp_rank, 2);
    const at::Tensor rows_target = target.narrow(0, 2 * dp_rank, 2);
    const at::Tensor out = tdist::fsdp::forward(net, rows, true).to(torch::kDouble);
    const at::Tensor local_loss = (out * rows_target).sum() / 2;
    local_loss.backward();
    const double norm = tdist::fsdp::clip_grad_norm_(net, 0.5).item<double>();
    opt.step();
    opt.zero_grad();
    at::Tensor loss = local_loss.detach().clone();
    tdist::all_reduce(loss, tdist::ReduceOp::AVG, mesh.get_group(dp_dim));
    EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), tolerance) << "step " << step;
    EXPECT_NEAR(norm, ref_norm, 10 * tolerance * ref_norm) << "step " << step << ": the norm";
  }
  tdist::destroy_process_group();
}

void run(int world, int dp, const std::string& variant = "") {
  ProcessOptions options;
  options.timeout = std::chrono::seconds(120);
  options.env = {{"TDIST_DP", std::to_string(dp)}, {"TDIST_VARIANT", variant}};
  expect_all_ok(run_ranks_as_processes("fsdp_over_tensor_parallel", world, options));
}

TEST(TwoDimensional, FSDPOverTensorParallelMatchesOneProcess) {
  run(4, 2);  // dp 2 x tp 2
  run(3, 1);  // tp 3 (uneven shards of 10), FSDP over one rank
  run(3, 3);  // dp 3, tp 1
}
TEST(TwoDimensional, MixedPrecisionOverTensorParallel) {
  run(4, 2, "mixed");
}
TEST(TwoDimensional, CPUOffloadOverTensorParallel) {
  run(4, 2, "offload");
}
TEST(TwoDimensional, HSDPOverTensorParallelOnAThreeDimensionalMesh) {
  run(4, 2, "hsdp");
}

}  // namespace

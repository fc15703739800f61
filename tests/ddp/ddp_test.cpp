// DistributedDataParallel and ZeroRedundancyOptimizer end to end: ranks as processes,
// parity against single-process training on the concatenated batches.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/training_helpers.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/symmetric_memory.h"
#include "tdist/ddp/distributed_data_parallel.h"
#include "tdist/ddp/zero_redundancy_optimizer.h"
#include "tdist/error.h"
#include "tdist/fsdp/activation_checkpoint.h"
#include "tdist/mesh/device_mesh.h"
#include "tdist/optim/adam.h"

namespace {

using namespace tdist::testing;
namespace ddp = tdist::ddp;

constexpr int kSteps = 20;
constexpr double kTol = 1e-5;

std::unique_ptr<torch::optim::Optimizer> make_sgd(std::vector<at::Tensor> params) {
  return std::make_unique<torch::optim::SGD>(std::move(params),
                                             torch::optim::SGDOptions(0.1).momentum(0.9));
}

/// TDIST_DDP_MODE: plain | tcp (shared memory off) | buckets (one bucket per tensor) | no_sync |
/// view | zero | zero_fused (ZeRO over tdist::optim's fused Adam) | fp16 | bf16.
TDIST_SCENARIO(ddp_parity) {
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  const std::string mode = env_or("TDIST_DDP_MODE", "plain");
  // "view": gradient_as_bucket_view, with 2-step accumulation into the views.
  const int accumulate = mode == "no_sync" ? 4 : mode == "view" ? 2 : 1;
  const auto data = make_batches(std::vector<int>(world, kSteps));

  Mlp model = make_mlp(rank);
  auto options = ddp::DistributedDataParallelOptions();
  if (mode == "buckets" || mode == "view") options.bucket_cap_mb(1e-6).first_bucket_cap_mb(1e-6);
  if (mode == "view") options.gradient_as_bucket_view(true);
  ddp::DistributedDataParallel net(model, options);
  if (mode == "buckets") {
    EXPECT_EQ(net.bucket_indices().size(), 4u);
  }
  if (mode == "plain") {
    EXPECT_EQ(net.bucket_indices().size(), 1u);
  }
  if (mode == "fp16") net.register_comm_hook(ddp::fp16_compress_hook);
  if (mode == "bf16") net.register_comm_hook(ddp::bf16_compress_hook);
  if (mode == "plain" || mode == "tcp") {
    // Buckets live in symmetric memory (Note [Buckets in symmetric memory]) unless shared
    // memory is off ("tcp": TDIST_GLOO_SHM=0); either way training matches.
    const bool want = mode == "plain";
    net.register_comm_hook([want, rank](ddp::GradBucket& bucket) {
      EXPECT_EQ(tdist::symmetric_memory::is_symmetric(bucket.buffer()), want) << "rank " << rank;
      return ddp::allreduce_hook(bucket);
    });
  }

  std::unique_ptr<torch::optim::Optimizer> opt;
  std::unique_ptr<ddp::ZeroRedundancyOptimizer> zero;
  if (mode == "zero") {
    zero = std::make_unique<ddp::ZeroRedundancyOptimizer>(
        model->parameters(),
        ddp::optimizer_factory<torch::optim::Adam>(torch::optim::AdamOptions(0.01)));
  } else if (mode == "zero_fused") {
    zero = std::make_unique<ddp::ZeroRedundancyOptimizer>(
        model->parameters(),
        ddp::optimizer_factory<tdist::optim::Adam>(
            tdist::optim::AdamOptions(0.01).implementation(tdist::optim::Implementation::kFused)));
  } else {
    opt = make_sgd(model->parameters());
  }

  auto zero_grad = [&] {
    if (zero) {
      zero->zero_grad();
    } else {
      opt->zero_grad();
    }
  };
  auto step = [&] {
    if (zero) {
      zero->step();
    } else {
      opt->step();
    }
  };
  for (int s = 0; s < kSteps; ++s) {
    const bool last_micro = s % accumulate == accumulate - 1;
    if (s % accumulate == 0) zero_grad();
    auto run = [&] {
      at::Tensor loss = loss_of(net, data.of_rank[rank][s]);
      loss.backward();
    };
    if (!last_micro) {
      auto guard = net.no_sync();
      run();
    } else {
      run();
      step();
    }
  }

  Mlp reference = make_mlp(0);
  std::unique_ptr<torch::optim::Optimizer> ref_opt;
  if (mode == "zero" || mode == "zero_fused") {
    ref_opt = std::make_unique<torch::optim::Adam>(reference->parameters(),
                                                   torch::optim::AdamOptions(0.01));
  } else {
    ref_opt = make_sgd(reference->parameters());
  }
  train_reference(reference, *ref_opt, data, world, accumulate);

  const double tol = (mode == "fp16") ? 2e-2 : (mode == "bf16") ? 1e-1 : kTol;
  const double diff = max_abs_diff(model->parameters(), reference->parameters());
  EXPECT_LE(diff, tol) << "rank " << rank << " mode " << mode;
  EXPECT_GT(max_abs_diff(model->parameters(), make_mlp(0)->parameters()), 1e-3)
      << "training did not move the parameters";
  EXPECT_EQ(max_diff_across_ranks(model->parameters()), 0.0);
  tdist::destroy_process_group();
}

/// Rank 1 builds a wider first layer: every rank raises, naming the parameter and rank.
TDIST_SCENARIO(ddp_shape_mismatch) {
  tdist::init_process_group();
  const int rank = tdist::get_rank();
  Mlp model(8, rank == 1 ? 32 : 16, 4);
  try {
    ddp::DistributedDataParallel net(model);
    ADD_FAILURE() << "rank " << rank << ": no error for differing models";
  } catch (const tdist::InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("fc1.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
  }
  tdist::destroy_process_group();
}

/// A model whose second head is used only on rank 0 and a third head used nowhere.
struct BranchyImpl : torch::nn::Module {
  BranchyImpl() {
    torch::manual_seed(7);
    trunk = register_module("trunk", torch::nn::Linear(4, 4));
    head_a = register_module("head_a", torch::nn::Linear(4, 1));
    head_b = register_module("head_b", torch::nn::Linear(4, 1));
    head_c = register_module("head_c", torch::nn::Linear(4, 1));
  }
  at::Tensor forward(const at::Tensor& x, bool use_b) {
    auto h = torch::relu(trunk(x));
    auto out = head_a(h);
    return use_b ? out + head_b(h) : out;
  }
  torch::nn::Linear trunk{nullptr}, head_a{nullptr}, head_b{nullptr}, head_c{nullptr};
};
TORCH_MODULE(Branchy);

TDIST_SCENARIO(ddp_find_unused) {
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  Branchy model;
  ddp::DistributedDataParallel net(
      model, ddp::DistributedDataParallelOptions().find_unused_parameters(true));
  torch::manual_seed(99);
  std::vector<at::Tensor> xs;
  for (int r = 0; r < world; ++r) xs.push_back(torch::randn({3, 4}));
  for (int step = 0; step < 2; ++step) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    at::Tensor out = net.forward(xs[rank], rank == 0);
    out.sum().backward();
  }
  // Reference: sum over ranks of each rank's loss, divided by world.
  Branchy ref;
  at::Tensor loss = torch::zeros({});
  for (int r = 0; r < world; ++r) loss = loss + ref->forward(xs[r], r == 0).sum();
  (loss / world).backward();
  for (const auto& name : {"trunk.weight", "head_a.weight", "head_b.weight", "head_b.bias"}) {
    auto got = model->named_parameters()[name].grad();
    ASSERT_TRUE(got.defined()) << name << " has no grad on rank " << rank;
    EXPECT_LE((got - ref->named_parameters()[name].grad()).abs().max().item<double>(), kTol)
        << name;
  }
  EXPECT_FALSE(model->head_c->weight.grad().defined())
      << "a parameter unused on every rank must keep .grad undefined";
  tdist::destroy_process_group();
}

/// Without find_unused_parameters an unused parameter is a clear error on every rank.
TDIST_SCENARIO(ddp_unused_without_flag) {
  tdist::init_process_group();
  Branchy model;
  ddp::DistributedDataParallel net(model);
  try {
    at::Tensor out = net.forward(torch::ones({2, 4}), true);
    out.sum().backward();
    ADD_FAILURE() << "no error for an unused parameter";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("head_c.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("find_unused_parameters"), std::string::npos);
  }
  tdist::destroy_process_group();
}

// A reentrant backward, as reentrant activation checkpointing runs one: the product with `w`
// is recomputed and backpropagated inside this function's backward, so w's gradient
// accumulator runs there, and once more for any direct use of w outside it.
struct ReentrantMatmul : torch::autograd::Function<ReentrantMatmul> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w) {
    ctx->save_for_backward({x});
    ctx->saved_data["w"] = w;
    return x.matmul(w.t());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_();
    const at::Tensor w = ctx->saved_data["w"].toTensor();
    at::Tensor out;
    {
      torch::AutoGradMode enable(true);
      out = x.matmul(w.t());
    }
    torch::autograd::backward({out}, {grads[0]});
    return {x.grad(), at::Tensor()};
  }
};

struct ReentrantNetImpl : torch::nn::Module {
  ReentrantNetImpl() {
    torch::manual_seed(3);
    w = register_parameter("w", torch::randn({3, 4}));
    unused = register_parameter("unused", torch::randn({2}));
  }
  // w gets its gradient in two passes: inside the reentrant backward, and from w.sum().
  at::Tensor forward(const at::Tensor& x) {
    return ReentrantMatmul::apply(x, w).pow(2).sum() + w.sum();
  }
  at::Tensor w, unused;
};
TORCH_MODULE(ReentrantNet);

/// static_graph: every step equals single-process training with a parameter unused on every
/// rank (kept without .grad) and one used by rank 0 only.
TDIST_SCENARIO(ddp_static_graph) {
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  Branchy model, ref;
  ddp::DistributedDataParallel net(model, ddp::DistributedDataParallelOptions().static_graph(true));
  torch::manual_seed(7);
  std::vector<at::Tensor> xs;
  for (int r = 0; r < world; ++r) xs.push_back(torch::randn({3, 4}));
  for (int step = 0; step < 3; ++step) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    for (auto& p : ref->parameters()) p.mutable_grad() = at::Tensor();
    net.forward(xs[rank], rank == 0).mul(step + 1).sum().backward();
    at::Tensor loss = torch::zeros({});
    for (int r = 0; r < world; ++r) loss = loss + ref->forward(xs[r], r == 0).sum();
    (loss * (step + 1) / world).backward();
    for (const auto& name : {"trunk.weight", "head_a.weight", "head_b.weight"}) {
      const auto got = model->named_parameters()[name].grad();
      ASSERT_TRUE(got.defined()) << name << " step " << step;
      EXPECT_LE((got - ref->named_parameters()[name].grad()).abs().max().item<double>(), kTol)
          << name << " step " << step;
    }
    EXPECT_FALSE(model->head_c->weight.grad().defined()) << "step " << step;
  }
  tdist::destroy_process_group();
}

/// static_graph: a backward that leaves out a parameter every rank used in the first
/// iteration is named on every rank (before any of its buckets is reduced).
TDIST_SCENARIO(ddp_static_graph_changed) {
  tdist::init_process_group();
  Branchy model;
  ddp::DistributedDataParallel net(model, ddp::DistributedDataParallelOptions().static_graph(true));
  for (int step = 0; step < 2; ++step) net.forward(torch::ones({2, 4}), true).sum().backward();
  try {
    net.forward(torch::ones({2, 4}), false).sum().backward();
    ADD_FAILURE() << "a changed graph was not refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("head_b."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("static_graph(true)"), std::string::npos) << e.what();
  }
  tdist::destroy_process_group();
}

/// A reentrant backward (w's gradient in two passes, one nested) is refused, naming it,
/// with find_unused_parameters and with static_graph: DDP reduces at the nested backward's
/// end, and the enclosing pass's gradient would be lost.
TDIST_SCENARIO(ddp_reentrant_backward) {
  tdist::init_process_group();
  for (bool static_graph : {false, true}) {
    ReentrantNet model;
    ddp::DistributedDataParallel net(model, ddp::DistributedDataParallelOptions()
                                                .find_unused_parameters(!static_graph)
                                                .static_graph(static_graph));
    try {
      net.forward(torch::ones({2, 4})).backward();
      ADD_FAILURE() << "a reentrant backward was not refused (static_graph " << static_graph << ")";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("reentrant"), std::string::npos) << e.what();
    }
  }
  tdist::destroy_process_group();
}

struct CheckpointedNetImpl : torch::nn::Module {
  CheckpointedNetImpl() {
    torch::manual_seed(13);
    embed = register_module("embed", torch::nn::Linear(4, 6));
    block1 = register_module("block1", torch::nn::Linear(6, 6));
    block2 = register_module("block2", torch::nn::Linear(6, 6));
    head = register_module("head", torch::nn::Linear(6, 2));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = torch::tanh(embed(x));
    h = torch::tanh(tdist::fsdp::checkpointed_forward(block1, h));
    h = torch::tanh(tdist::fsdp::checkpointed_forward(block2, h));
    return head(h);
  }
  torch::nn::Linear embed{nullptr}, block1{nullptr}, block2{nullptr}, head{nullptr};
};
TORCH_MODULE(CheckpointedNet);

/// DDP over a model whose blocks run under tdist's activation checkpointing (each block's
/// backward is a nested one): every parameter's gradient equals one process's, step after step.
TDIST_SCENARIO(ddp_activation_checkpointing) {
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  CheckpointedNet model, ref;
  ddp::DistributedDataParallel net(model);
  torch::manual_seed(17);
  std::vector<at::Tensor> xs;
  for (int r = 0; r < world; ++r) xs.push_back(torch::randn({3, 4}));
  for (int step = 0; step < 2; ++step) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    for (auto& p : ref->parameters()) p.mutable_grad() = at::Tensor();
    net.forward(xs[rank]).pow(2).sum().backward();
    at::Tensor loss = torch::zeros({});
    for (int r = 0; r < world; ++r) loss = loss + ref->forward(xs[r]).pow(2).sum();
    (loss / world).backward();
    for (const auto& item : model->named_parameters()) {
      const auto got = item.value().grad();
      ASSERT_TRUE(got.defined()) << item.key();
      EXPECT_LE((got - ref->named_parameters()[item.key()].grad()).abs().max().item<double>(), kTol)
          << item.key() << " step " << step;
    }
  }
  tdist::destroy_process_group();
}

/// device_mesh: a 1-D mesh replicates over its group (here the world's, so gradients equal
/// one process's); a 2-D mesh, or a mesh with a process group, is refused.
TDIST_SCENARIO(ddp_device_mesh) {
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  const auto mesh = tdist::mesh::init_device_mesh("cpu", {world}, {"dp"});
  Branchy model, ref;
  ddp::DistributedDataParallel net(
      model, ddp::DistributedDataParallelOptions().device_mesh(mesh).find_unused_parameters(true));
  torch::manual_seed(5);
  std::vector<at::Tensor> xs;
  for (int r = 0; r < world; ++r) xs.push_back(torch::randn({3, 4}));
  net.forward(xs[rank], true).sum().backward();
  at::Tensor loss = torch::zeros({});
  for (int r = 0; r < world; ++r) loss = loss + ref->forward(xs[r], true).sum();
  (loss / world).backward();
  EXPECT_LE((model->trunk->weight.grad() - ref->trunk->weight.grad()).abs().max().item<double>(),
            kTol);
  if (world % 2 == 0) {
    const auto mesh2 = tdist::mesh::init_device_mesh("cpu", {2, world / 2}, {"dp", "tp"});
    expect_invalid_argument(
        [&] {
          ddp::DistributedDataParallel(Branchy(),
                                       ddp::DistributedDataParallelOptions().device_mesh(mesh2));
        },
        "1-D");
  }
  expect_invalid_argument(
      [&] {
        ddp::DistributedDataParallel(
            Branchy(), ddp::DistributedDataParallelOptions().device_mesh(mesh).process_group(
                           tdist::group_world()));
      },
      "not both");
  tdist::destroy_process_group();
}

struct WithBufferImpl : torch::nn::Module {
  WithBufferImpl() {
    fc = register_module("fc", torch::nn::Linear(2, 2));
    counter = register_buffer("counter", torch::zeros({3}));
  }
  at::Tensor forward(const at::Tensor& x) { return fc(x); }
  torch::nn::Linear fc{nullptr};
  at::Tensor counter;
};
TORCH_MODULE(WithBuffer);

TDIST_SCENARIO(ddp_broadcast_buffers) {
  tdist::init_process_group();
  const int rank = tdist::get_rank();
  WithBuffer model;
  ddp::DistributedDataParallel net(model);
  {
    torch::NoGradGuard no_grad;
    model->counter.fill_(10 + rank);  // diverge after construction
  }
  net.forward(torch::ones({1, 2})).sum().backward();
  EXPECT_EQ(model->counter[0].item<float>(), 10.0f) << "buffers not broadcast from rank 0";
  tdist::destroy_process_group();
}

void run(const std::string& scenario, int world, std::map<std::string, std::string> env = {}) {
  ProcessOptions options;
  options.env = std::move(env);
  options.timeout = std::chrono::seconds(90);
  expect_all_ok(run_ranks_as_processes(scenario, world, options));
}

class DdpParity : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(DdpParity, MatchesSingleProcessTraining) {
  const auto& [mode, world] = GetParam();
  std::map<std::string, std::string> env = {{"TDIST_DDP_MODE", mode}};
  if (mode == "tcp") env["TDIST_GLOO_SHM"] = "0";
  run("ddp_parity", world, env);
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, DdpParity,
    ::testing::Values(std::make_tuple("plain", 1), std::make_tuple("plain", 2),
                      std::make_tuple("plain", 3), std::make_tuple("plain", 4),
                      std::make_tuple("tcp", 3), std::make_tuple("buckets", 3),
                      std::make_tuple("view", 2), std::make_tuple("no_sync", 2),
                      std::make_tuple("no_sync", 3), std::make_tuple("no_sync", 4),
                      std::make_tuple("zero", 2), std::make_tuple("zero", 3),
                      std::make_tuple("zero", 4), std::make_tuple("zero_fused", 3),
                      std::make_tuple("fp16", 2), std::make_tuple("bf16", 2)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_world" + std::to_string(std::get<1>(info.param));
    });

TEST(Ddp, ShapeMismatchRaisesOnEveryRank) {
  run("ddp_shape_mismatch", 2);
  run("ddp_shape_mismatch", 3);
}
TEST(Ddp, FindUnusedParameters) {
  run("ddp_find_unused", 2);
}
TEST(Ddp, UnusedParameterWithoutFlagIsAnError) {
  run("ddp_unused_without_flag", 2);
}
TEST(Ddp, BroadcastBuffersEachForward) {
  run("ddp_broadcast_buffers", 2);
}
TEST(Ddp, StaticGraph) {
  for (int world : {1, 2, 3}) run("ddp_static_graph", world);
  for (int world : {1, 3}) run("ddp_static_graph_changed", world);
}
TEST(Ddp, ActivationCheckpointedBlocks) {
  for (int world : {2, 3}) run("ddp_activation_checkpointing", world);
}
TEST(Ddp, ReentrantBackwardIsRefused) {
  run("ddp_reentrant_backward", 2);
}
TEST(Ddp, DeviceMesh) {
  for (int world : {2, 3, 4}) run("ddp_device_mesh", world);
}

}  // namespace

// FSDP, complete: mixed precision, CPU offload, HSDP, gradient accumulation
// without sync, explicit prefetch, summon_full_params, frozen and ignored parameters,
// clip_grad_norm_ and Join, each against a single-process (unsharded) reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <thread>

#include "fsdp/tiny_transformer.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/detail/fsdp/shard_layout.h"
#include "tdist/error.h"
#include "tdist/fsdp/clip_grad.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/full_params.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/join.h"
#include "tdist/fsdp/state_dict.h"
#include "tdist/mesh/device_mesh.h"
#include "tdist/optim/adam.h"

namespace tdist::fsdp {
namespace {

using testing::max_param_diff;
using testing::TinyConfig;
using testing::TinyTransformer;

constexpr int64_t kLocalBatch = 2;
constexpr double kTol = 1e-5;

using tdist::testing::env_str;

torch::optim::AdamW make_adamw(TinyTransformer& model) {
  return torch::optim::AdamW(model->parameters(),
                             torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
}

std::vector<FSDPModule> shard_model(TinyTransformer& model, const FullyShardOptions& options) {
  std::vector<FSDPModule> handles;
  for (auto& block : model->blocks) handles.push_back(fully_shard(block, options));
  handles.push_back(fully_shard(model, options));
  return handles;
}

// This rank's rows of the global batch: [rank * B, rank * B + B).
std::pair<torch::Tensor, torch::Tensor> local_rows(const torch::Tensor& x, const torch::Tensor& y,
                                                   int rank, int64_t rows = kLocalBatch) {
  return {x.narrow(0, rank * rows, rows), y.narrow(0, rank * rows, rows)};
}

double global_mean(double local) {
  auto t = torch::tensor({local}, torch::kFloat64);
  all_reduce(t);
  return t.item<double>() / get_world_size();
}

// Trains `steps` steps with `options` (FT_MESH = "hsdp" builds a (world/2, 2) mesh) against
// the reference, asserting loss parity within `tol` relative to the loss.
void train_parity(const FullyShardOptions& options, int steps, double rel_tol) {
  const int world = get_world_size();
  const int rank = get_rank();
  TinyConfig c;
  TinyTransformer ref = testing::make_tiny(c);
  auto ref_opt = make_adamw(ref);
  TinyTransformer model = testing::make_tiny(c);
  shard_model(model, options);
  auto opt = make_adamw(model);
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = testing::tiny_batch(c, kLocalBatch * world, step);
    ref_opt.zero_grad();
    auto ref_loss = testing::lm_loss(ref->forward(x), y);
    ref_loss.backward();
    ref_opt.step();
    opt.zero_grad();
    auto [lx, ly] = local_rows(x, y, rank);
    auto out = tdist::fsdp::forward(model, lx);
    auto loss = testing::lm_loss(out.to(torch::kFloat), ly);
    loss.backward();
    opt.step();
    const double got = global_mean(loss.item<double>());
    const double want = ref_loss.item<double>();
    EXPECT_NEAR(got, want, rel_tol * std::max(1.0, std::abs(want))) << "step " << step;
  }
  // The sharded (master) parameters and the optimizer state keep fp32.
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
  const double diff = max_param_diff(model, ref);
  EXPECT_LE(diff, rel_tol * 10) << "rank " << rank;
}

// ---- mixed precision ----------------------------------------------------------------------

// Tolerance: bf16 keeps 8 significant bits (relative rounding 2^-9 ~ 0.002 per value); the
// tiny model's losses (~3.1) after 6 AdamW steps at lr 1e-2 drift from fp32 by well under
// 2%, while a run that, e.g., dropped gradients or reduced garbage diverges by far more.
TDIST_SCENARIO(fsdp_mixed_precision) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const TinyConfig c;
  FullyShardOptions options;
  options.mp_policy(
      MixedPrecisionPolicy().param_dtype(torch::kBFloat16).reduce_dtype(torch::kFloat));
  train_parity(options, 6, 0.02);

  // While unsharded, the parameters are bf16; at rest fp32 shards again.
  TinyTransformer model = testing::make_tiny(c);
  for (auto& block : model->blocks) fully_shard(block, options);
  // output_dtype on the root only: the blocks' bf16 outputs feed the root's bf16 layers.
  FullyShardOptions root_options = options;
  root_options.mp_policy(MixedPrecisionPolicy()
                             .param_dtype(torch::kBFloat16)
                             .reduce_dtype(torch::kFloat)
                             .output_dtype(torch::kFloat));
  std::vector<FSDPModule> handles{fully_shard(model, root_options)};
  handles.back().unshard();
  EXPECT_EQ(model->head->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(model->head->weight.size(0), c.vocab);
  handles.back().reshard();
  EXPECT_EQ(model->head->weight.scalar_type(), torch::kFloat);
  // Outputs are cast to output_dtype; without it they stay in param_dtype.
  auto [x, y] = testing::tiny_batch(c, kLocalBatch, 0);
  {
    torch::NoGradGuard no_grad;
    EXPECT_EQ(tdist::fsdp::forward(model, x).scalar_type(), torch::kFloat);
  }
  destroy_process_group();
}

// ---- CPU offload --------------------------------------------------------------------------

// On a CPU-only build offloading changes where nothing lives; results must be identical.
TDIST_SCENARIO(fsdp_offload) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank();
  TinyConfig c;
  TinyTransformer a = testing::make_tiny(c);
  TinyTransformer b = testing::make_tiny(c);
  shard_model(a, FullyShardOptions());
  shard_model(b, FullyShardOptions().offload_policy(CPUOffloadPolicy(/*pin_memory=*/true)));
  auto opt_a = make_adamw(a);
  auto opt_b = make_adamw(b);
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = testing::tiny_batch(c, kLocalBatch * get_world_size(), step);
    auto [lx, ly] = local_rows(x, y, rank);
    for (auto* pair : {&a, &b}) {
      auto& opt = pair == &a ? opt_a : opt_b;
      opt.zero_grad();
      testing::lm_loss(tdist::fsdp::forward(*pair, lx), ly).backward();
      opt.step();
    }
  }
  auto pb = b->named_parameters();
  for (const auto& item : a->named_parameters()) {
    EXPECT_TRUE(pb[item.key()].device().is_cpu());
    EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  }
  destroy_process_group();
}

// Offloaded shards stepped by ATen's fused CPU AdamW (tdist::optim), clipped by the sync-free
// clip_grad_norm_, follow LibTorch's per-parameter AdamW on resident shards.
TDIST_SCENARIO(fsdp_offload_fused_adamw) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank();
  TinyConfig c;
  TinyTransformer a = testing::make_tiny(c);
  TinyTransformer b = testing::make_tiny(c);
  shard_model(a, FullyShardOptions());
  shard_model(b, FullyShardOptions().offload_policy(CPUOffloadPolicy(/*pin_memory=*/true)));
  auto opt_a = make_adamw(a);
  tdist::optim::AdamW opt_b(b->parameters(),
                            tdist::optim::AdamWOptions(1e-2).weight_decay(0.01).implementation(
                                tdist::optim::Implementation::kFused));
  for (int step = 0; step < 6; ++step) {
    auto [x, y] = testing::tiny_batch(c, kLocalBatch * get_world_size(), step);
    auto [lx, ly] = local_rows(x, y, rank);
    opt_a.zero_grad();
    opt_b.zero_grad();
    testing::lm_loss(tdist::fsdp::forward(a, lx), ly).backward();
    testing::lm_loss(tdist::fsdp::forward(b, lx), ly).backward();
    const double norm_a = clip_grad_norm_(a, 0.5).item<double>();
    const double norm_b = clip_grad_norm_(b, 0.5).item<double>();
    EXPECT_NEAR(norm_a, norm_b, 1e-6 * norm_a) << "step " << step;
    opt_a.step();
    opt_b.step();
  }
  auto pb = b->named_parameters();
  for (const auto& item : a->named_parameters()) {  // this rank's shards, side by side
    EXPECT_LE((item.value() - pb[item.key()]).abs().max().item<double>(), 1e-6) << item.key();
  }
  destroy_process_group();
}

// ---- HSDP ---------------------------------------------------------------------------------

TDIST_SCENARIO(fsdp_hsdp) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size();
  const int shard = std::atoi(env_str("FT_SHARD", "2").c_str());
  auto mesh = mesh::init_device_mesh("cpu", {world / shard, shard}, {"replicate", "shard"});
  FullyShardOptions options;
  options.mesh(mesh);
  train_parity(options, 8, kTol);
  // Parameters are sharded over the shard dim only: 1/shard of each.
  TinyConfig c;
  TinyTransformer model = testing::make_tiny(c);
  shard_model(model, options);
  const ShardLayout expected =
      ShardLayout::compute({c.vocab, c.width}, shard, mesh.get_local_rank(1));
  EXPECT_EQ(model->head->weight.size(0), expected.local_rows);
  destroy_process_group();
}

// ---- gradient accumulation without sync ---------------------------------------------------

TDIST_SCENARIO(fsdp_no_sync) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size();
  const int rank = get_rank();
  TinyConfig c;
  constexpr int kMicro = 3;
  TinyTransformer ref = testing::make_tiny(c);
  auto ref_opt = make_adamw(ref);
  TinyTransformer model = testing::make_tiny(c);
  auto handles = shard_model(model, FullyShardOptions());
  FSDPModule root = handles.back();
  auto opt = make_adamw(model);
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = testing::tiny_batch(c, kLocalBatch * world * kMicro, step);
    ref_opt.zero_grad();
    auto ref_loss = testing::lm_loss(ref->forward(x), y);
    ref_loss.backward();
    ref_opt.step();
    opt.zero_grad();
    const int64_t reduces_before = handles.front().stats().reduce_scatters;
    for (int m = 0; m < kMicro; ++m) {
      auto lx = x.narrow(0, (m * world + rank) * kLocalBatch, kLocalBatch);
      auto ly = y.narrow(0, (m * world + rank) * kLocalBatch, kLocalBatch);
      if (step % 2 == 0) {
        root.set_requires_gradient_sync(m == kMicro - 1);  // FSDP2 style
        (testing::lm_loss(tdist::fsdp::forward(model, lx), ly) / kMicro).backward();
      } else if (m < kMicro - 1) {
        NoSync no_sync(root);  // FSDP1 style
        EXPECT_FALSE(handles.front().requires_gradient_sync());
        (testing::lm_loss(tdist::fsdp::forward(model, lx), ly) / kMicro).backward();
      } else {
        EXPECT_TRUE(handles.front().requires_gradient_sync());
        (testing::lm_loss(tdist::fsdp::forward(model, lx), ly) / kMicro).backward();
      }
    }
    // Only the synced micro-batch reduced.
    EXPECT_EQ(handles.front().stats().reduce_scatters - reduces_before, 1) << "step " << step;
    opt.step();
  }
  EXPECT_LE(max_param_diff(model, ref), kTol);
  destroy_process_group();
}

// ---- explicit prefetch --------------------------------------------------------------------

TDIST_SCENARIO(fsdp_explicit_prefetch) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  TinyConfig c;
  c.blocks = 3;
  TinyTransformer model = testing::make_tiny(c);
  auto handles = shard_model(model, FullyShardOptions());
  // Block 0 prefetches blocks 1 and 2 at once in forward; block 2 prefetches block 0 in
  // backward (skipping block 1, which then all-gathers on demand).
  handles[0].set_modules_to_forward_prefetch({handles[1], handles[2]});
  handles[2].set_modules_to_backward_prefetch({handles[0]});
  TinyTransformer ref = testing::make_tiny(c);
  auto [x, y] = testing::tiny_batch(c, kLocalBatch * get_world_size(), 0);
  auto [lx, ly] = local_rows(x, y, get_rank());
  for (auto& h : handles) h.reset_stats();
  testing::lm_loss(tdist::fsdp::forward(model, lx), ly).backward();
  EXPECT_EQ(handles[1].stats().prefetches, 1);  // forward, by block 0
  // forward by block 0, and backward by the root (default order: the root's backward
  // prefetches the module whose forward ended just before its own, block 2).
  EXPECT_EQ(handles[2].stats().prefetches, 2);
  EXPECT_EQ(handles[0].stats().prefetches, 1);  // backward, by block 2
  for (auto& h : handles) EXPECT_FALSE(h.is_unsharded());
  destroy_process_group();
}

// ---- summon_full_params -------------------------------------------------------------------

TDIST_SCENARIO(fsdp_summon) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank();
  TinyConfig c;
  c.vocab = 7;  // uneven rows at world 3 and 4
  TinyTransformer ref = testing::make_tiny(c);
  TinyTransformer model = testing::make_tiny(c);
  shard_model(model,
              FullyShardOptions().mp_policy(MixedPrecisionPolicy().param_dtype(torch::kBFloat16)));
  auto [x, y] = testing::tiny_batch(c, kLocalBatch * get_world_size(), 0);
  auto [lx, ly] = local_rows(x, y, rank);
  testing::lm_loss(tdist::fsdp::forward(model, lx), ly).backward();
  const auto shard_shape = model->head->weight.sizes().vec();
  {
    SummonFullParams full(model, SummonFullParamsOptions().with_grads(true));
    // Full parameters, in fp32 (not param_dtype), equal to the unsharded model's.
    EXPECT_EQ(model->head->weight.sizes(), ref->head->weight.sizes());
    EXPECT_EQ(model->head->weight.scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::equal(model->head->weight, ref->head->weight));
    EXPECT_EQ(model->head->weight.grad().sizes(), ref->head->weight.sizes());
    torch::NoGradGuard no_grad;
    model->head->weight.fill_(0.5);  // written back on exit
  }
  EXPECT_EQ(model->head->weight.sizes().vec(), shard_shape);
  EXPECT_EQ(model->head->weight.grad().sizes().vec(), shard_shape);
  {
    SummonFullParams full(model, SummonFullParamsOptions().writeback(false));
    EXPECT_TRUE(torch::all(model->head->weight == 0.5).item<bool>());
    torch::NoGradGuard no_grad;
    model->head->weight.fill_(-1.0);  // not written back
  }
  {
    SummonFullParams full(model);
    EXPECT_TRUE(torch::all(model->head->weight == 0.5).item<bool>());
  }
  destroy_process_group();
}

// ---- frozen and ignored parameters ----------------------------------------------------------

TDIST_SCENARIO(fsdp_frozen) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size();
  const int rank = get_rank();
  TinyConfig c;
  TinyTransformer ref = testing::make_tiny(c);
  TinyTransformer model = testing::make_tiny(c);
  for (auto* m : {&ref, &model}) {
    // A frozen weight beside a trainable bias in one module, and a frozen embedding.
    (*m)->blocks[0]->fc1->weight.set_requires_grad(false);
    (*m)->tok->weight.set_requires_grad(false);
  }
  // pos is ignored: each rank keeps it whole and it is never reduced, so it trains on
  // each rank's local gradient only; keep it frozen in both models for parity.
  ref->pos.set_requires_grad(false);
  model->pos.set_requires_grad(false);
  shard_model(model, FullyShardOptions().ignored_params({model->pos}));
  EXPECT_EQ(model->pos.sizes(), ref->pos.sizes());  // ignored: not sharded
  auto trainable = [](TinyTransformer& m) {
    std::vector<torch::Tensor> out;
    for (const auto& p : m->parameters()) {
      if (p.requires_grad()) out.push_back(p);
    }
    return out;
  };
  torch::optim::AdamW ref_opt(trainable(ref), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW opt(trainable(model), torch::optim::AdamWOptions(1e-2));
  const auto frozen_before = model->blocks[0]->fc1->weight.clone();
  for (int step = 0; step < 5; ++step) {
    auto [x, y] = testing::tiny_batch(c, kLocalBatch * world, step);
    ref_opt.zero_grad();
    auto ref_loss = testing::lm_loss(ref->forward(x), y);
    ref_loss.backward();
    ref_opt.step();
    opt.zero_grad();
    auto [lx, ly] = local_rows(x, y, rank);
    auto loss = testing::lm_loss(tdist::fsdp::forward(model, lx), ly);
    loss.backward();
    EXPECT_FALSE(model->blocks[0]->fc1->weight.grad().defined());
    EXPECT_TRUE(model->blocks[0]->fc1->bias.grad().defined());
    opt.step();
    EXPECT_NEAR(global_mean(loss.item<double>()), ref_loss.item<double>(), kTol);
  }
  EXPECT_TRUE(torch::equal(model->blocks[0]->fc1->weight, frozen_before));
  EXPECT_LE(max_param_diff(model, ref), kTol);
  destroy_process_group();
}

// ---- clip_grad_norm_ ----------------------------------------------------------------------

TDIST_SCENARIO(fsdp_clip) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size();
  const int rank = get_rank();
  TinyConfig c;
  c.vocab = 7;  // uneven shards at world 3 and 4
  TinyTransformer ref = testing::make_tiny(c);
  auto ref_opt = make_adamw(ref);
  TinyTransformer model = testing::make_tiny(c);
  shard_model(model, FullyShardOptions());
  auto opt = make_adamw(model);
  for (double norm_type : {2.0, 1.0, std::numeric_limits<double>::infinity()}) {
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = testing::tiny_batch(c, kLocalBatch * world, step);
      ref_opt.zero_grad();
      testing::lm_loss(ref->forward(x), y).backward();
      const double want = torch::nn::utils::clip_grad_norm_(ref->parameters(), 0.05, norm_type);
      ref_opt.step();
      opt.zero_grad();
      auto [lx, ly] = local_rows(x, y, rank);
      testing::lm_loss(tdist::fsdp::forward(model, lx), ly).backward();
      const double got = clip_grad_norm_(model, 0.05, norm_type).item<double>();
      EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, want)) << "norm " << norm_type;
      EXPECT_GT(want, 0.05);  // clipping really happened
      opt.step();
    }
  }
  EXPECT_LE(max_param_diff(model, ref), kTol);
  destroy_process_group();
}

// ---- Join -----------------------------------------------------------------------------------

// Rank r has kBase + (world - 1 - r) batches. The reference steps the unsharded model on
// the sum of the active ranks' mean losses divided by the world size: joined ranks
// contribute zero gradients to the average over the initial world size.
TDIST_SCENARIO(fsdp_join) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size();
  const int rank = get_rank();
  constexpr int kBase = 2;
  const std::string reshard = env_str("FT_RESHARD", "true");
  TinyConfig c;
  c.vocab = 7;
  TinyTransformer ref = testing::make_tiny(c);
  auto ref_opt = make_adamw(ref);
  TinyTransformer model = testing::make_tiny(c);
  FullyShardOptions options;
  if (reshard == "false") options.reshard_after_forward(false);
  if (reshard == "2") options.reshard_after_forward(2);
  auto handles = shard_model(model, options);
  auto opt = make_adamw(model);
  auto batches_of = [&](int r) { return kBase + (world - 1 - r); };
  const int total_steps = batches_of(0);
  // Reference: every step, the ranks that still have data.
  for (int step = 0; step < total_steps; ++step) {
    auto [x, y] = testing::tiny_batch(c, kLocalBatch * world, step);
    ref_opt.zero_grad();
    torch::Tensor loss = torch::zeros({});
    for (int r = 0; r < world; ++r) {
      if (step >= batches_of(r)) continue;
      auto [lx, ly] = local_rows(x, y, r);
      loss = loss + testing::lm_loss(ref->forward(lx), ly);
    }
    (loss / world).backward();
    torch::nn::utils::clip_grad_norm_(ref->parameters(), 1.0);
    ref_opt.step();
  }
  FSDPJoinable joinable(handles.back(), [&] {
    clip_grad_norm_(model, 1.0);
    opt.step();
  });
  join::Join join({&joinable});
  join.run([&] {
    for (int step = 0; step < batches_of(rank); ++step) {
      auto [x, y] = testing::tiny_batch(c, kLocalBatch * world, step);
      auto [lx, ly] = local_rows(x, y, rank);
      opt.zero_grad();
      testing::lm_loss(tdist::fsdp::forward(model, lx), ly).backward();
      clip_grad_norm_(model, 1.0);
      opt.step();
    }
  });
  EXPECT_LE(max_param_diff(model, ref), kTol) << "rank " << rank;
  destroy_process_group();
}

// ---- a step abandoned with a placed all-gather in flight ----------------------------------

// A block whose forward a test can make throw or stall on one rank.
struct ActingBlockImpl : torch::nn::Module {
  explicit ActingBlockImpl(int64_t width)
      : linear(register_module("linear", torch::nn::Linear(width, width))) {}
  at::Tensor forward(const at::Tensor& x) {
    if (action) action();
    return torch::relu(linear(x));
  }
  torch::nn::Linear linear;
  std::function<void()> action;
};
TORCH_MODULE(ActingBlock);

struct TwoBlocksImpl : torch::nn::Module {
  explicit TwoBlocksImpl(int64_t width)
      : a(register_module("a", ActingBlock(width))), b(register_module("b", ActingBlock(width))) {}
  at::Tensor forward(const at::Tensor& x) {
    return tdist::fsdp::forward(b, tdist::fsdp::forward(a, x));
  }
  ActingBlock a, b;
};
TORCH_MODULE(TwoBlocks);

constexpr int64_t kActingWidth = 37;  // shards of uneven size at world 2

// Note [Abandoned placed all-gather] (src/fsdp/param_group.cpp): rank 0's block a throws
// after prefetching block b, whose all-gather (placed, straight into b's unsharded block)
// cannot finish until rank 1 gets there, 8 s later. Rank 0 destroys the model meanwhile: b's
// group waits, then leaks its block with a warning, and when the collective does run, it
// writes into the leaked block using only what it shares. Rank 0 must survive that (its heap
// reused first), and rank 1 must compute block b with the parameters rank 0 contributed.
TDIST_SCENARIO(fsdp_abandoned_step) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int rank = get_rank();
  torch::manual_seed(7);
  TwoBlocks ref(kActingWidth);
  torch::manual_seed(7);
  auto x = torch::randn({3, kActingWidth});
  {
    torch::manual_seed(7);
    TwoBlocks model(kActingWidth);
    FSDPModule a = fully_shard(model->a, FullyShardOptions());
    FSDPModule b = fully_shard(model->b, FullyShardOptions());
    fully_shard(model, FullyShardOptions());
    if (rank == 0) {
      a.set_modules_to_forward_prefetch({b});
      model->a->action = [] { throw std::runtime_error("user code failed in block a"); };
      try {
        tdist::fsdp::forward(model, x);
        ADD_FAILURE() << "block a's exception did not reach the caller";
      } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("user code failed in block a"), std::string::npos)
            << e.what();
      }
      EXPECT_EQ(b.stats().prefetches, 1) << "b's all-gather was issued by a's pre-forward";
      EXPECT_FALSE(b.is_unsharded()) << "and is still in flight";
    } else {
      model->a->action = [] { std::this_thread::sleep_for(std::chrono::seconds(8)); };
      auto out = tdist::fsdp::forward(model, x);
      torch::NoGradGuard no_grad;
      auto want = torch::relu(ref->b->linear(torch::relu(ref->a->linear(x))));
      EXPECT_TRUE(torch::allclose(out, want, 1e-5, 1e-6))
          << "max diff " << (out - want).abs().max().item<double>();
    }
  }
  // FSDP drops the states of destroyed modules when the next module is sharded; one without
  // parameters needs no collective for it, so on rank 0 b's group goes while rank 1 sleeps.
  torch::nn::ReLU next;
  fully_shard(next, FullyShardOptions());
  if (rank == 0) {
    std::vector<std::vector<int64_t>> junk;  // the heap b's group freed, reused
    for (int i = 0; i < 4096; ++i) junk.emplace_back(1 + i % 8, int64_t(1) << 40);
  }
  barrier();  // queued behind b's all-gather on rank 0: it has run when this returns
  destroy_process_group();
}

// ---- a module called more than once in one forward -------------------------------------

/// What one step of `train_beside_reference` issued on the group it watches.
struct StepCollectives {
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
};

/// Four AdamW steps of `model` (fully_shard'ed; this rank's rows of each global batch of
/// 8-wide inputs and 3-wide targets) beside `reference` (the whole batch, one process):
/// `before_step(step)` runs first, `after_backward(step, issued)` gets what `group` issued in
/// the step's forward and backward; at the end the full parameters match the reference's.
template <class Holder>
void train_beside_reference(
    Holder& reference, Holder& model, const FSDPModule& group, uint64_t seed,
    const std::function<void(int)>& before_step,
    const std::function<void(int, const StepCollectives&)>& after_backward) {
  const int world = get_world_size(), rank = get_rank();
  auto ref_opt = torch::optim::AdamW(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  auto opt = torch::optim::AdamW(model->parameters(), torch::optim::AdamWOptions(1e-2));
  constexpr int64_t kLocal = 3;
  for (int step = 0; step < 4; ++step) {
    before_step(step);
    torch::manual_seed(seed + step);
    const at::Tensor x = torch::randn({kLocal * world, 8});
    const at::Tensor y = torch::randn({kLocal * world, 3});
    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    ref_opt.step();

    opt.zero_grad();
    const int64_t gathers = group.stats().all_gathers;
    const int64_t reduces = group.stats().reduce_scatters;
    torch::mse_loss(tdist::fsdp::forward(model, x.narrow(0, kLocal * rank, kLocal)),
                    y.narrow(0, kLocal * rank, kLocal))
        .backward();
    after_backward(step,
                   {group.stats().all_gathers - gathers, group.stats().reduce_scatters - reduces});
    opt.step();
  }
  const auto full = get_model_state_dict(*model, StateDictOptions().full_state_dict(true));
  EXPECT_EQ(full.size(), reference->named_parameters().size());
  for (const auto& item : reference->named_parameters()) {
    EXPECT_TRUE(torch::allclose(full.at(item.key()).local, item.value(), 1e-5, 1e-6)) << item.key();
  }
}

// A shared block applied three times per forward, once to raw data (that call's
// post-backward hook never fires: its input needs no gradient). Every call all-gathers; the
// gradients of all three calls are reduced once, after the last call's backward
// (Note [Module called more than once]), and training matches the single-process model.
struct ReusedBlockImpl : torch::nn::Module {
  ReusedBlockImpl() {
    inp = register_module("inp", torch::nn::Linear(8, 8));
    shared = register_module("shared", torch::nn::Linear(8, 8));
    out = register_module("out", torch::nn::Linear(8, 3));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor side = tdist::fsdp::forward(shared, x);
    at::Tensor h = torch::tanh(inp(x));
    h = torch::tanh(tdist::fsdp::forward(shared, h));
    h = torch::tanh(tdist::fsdp::forward(shared, h));
    return out(h + side);
  }
  torch::nn::Linear inp{nullptr}, shared{nullptr}, out{nullptr};
};
TORCH_MODULE(ReusedBlock);

TDIST_SCENARIO(fsdp_module_called_twice) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  torch::manual_seed(5);
  ReusedBlock reference;
  torch::manual_seed(5);
  ReusedBlock model;
  FSDPModule shared = fully_shard(model->shared);
  fully_shard(model);
  train_beside_reference(
      reference, model, shared, 100, [](int) {},
      [&](int step, const StepCollectives& issued) {
        EXPECT_EQ(issued.reduce_scatters, 1) << "step " << step;
        EXPECT_EQ(issued.all_gathers, 4) << "step " << step << ": three calls and one backward";
        EXPECT_FALSE(shared.is_unsharded()) << "resharded after the last call's backward";
      });
  destroy_process_group();
}

TEST(FSDPModuleCalledTwice, ASharedBlockCalledThreeTimesTrainsLikeOneProcessAtWorlds2And3) {
  tdist::testing::expect_all_ok_at_worlds("fsdp_module_called_twice", {2, 3});
}

// ---- fully_shard over several modules at once ------------------------------------------

// FSDP2's fully_shard([a, b]): two sibling layers share one group, so one reduce-scatter per
// step; each module's forward all-gathers (b re-gathers after a's reshard), and with
// set_reshard_after_forward(false) one all-gather serves both and backward. Training matches
// the single-process model; without a sharded root above them the first forward says so.
struct SiblingsImpl : torch::nn::Module {
  SiblingsImpl() {
    a = register_module("a", torch::nn::Linear(8, 6));
    b = register_module("b", torch::nn::Linear(8, 6));
    out = register_module("out", torch::nn::Linear(6, 3));
  }
  at::Tensor forward(const at::Tensor& x) {
    return out(torch::tanh(tdist::fsdp::forward(a, x)) * torch::tanh(tdist::fsdp::forward(b, x)));
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, out{nullptr};
};
TORCH_MODULE(Siblings);

std::vector<std::shared_ptr<torch::nn::Module>> siblings_of(Siblings& m) {
  return {m->a.ptr(), m->b.ptr()};
}

TDIST_SCENARIO(fsdp_grouped_modules) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  torch::manual_seed(6);
  Siblings reference;
  torch::manual_seed(6);
  Siblings model;
  FSDPModule pair = fully_shard(siblings_of(model));
  fully_shard(model);
  EXPECT_TRUE(fsdp_module(*model->b) == pair) << "one handle for both";
  EXPECT_TRUE(fsdp_module(*model->a) == pair);
  EXPECT_TRUE(fsdp_module(*model) != pair);
  train_beside_reference(
      reference, model, pair, 200,
      [&](int step) {
        if (step == 2) pair.set_reshard_after_forward(false);
      },
      [](int step, const StepCollectives& issued) {
        EXPECT_EQ(issued.reduce_scatters, 1) << "step " << step;
        EXPECT_EQ(issued.all_gathers, step < 2 ? 3 : 1) << "step " << step;
      });

  Siblings lone;  // grouped, but no sharded root above
  fully_shard(siblings_of(lone));
  try {
    tdist::fsdp::forward(lone->a, torch::randn({2, 8}));
    ADD_FAILURE() << "a grouped module ran without a root";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("root"), std::string::npos) << e.what();
  }
  destroy_process_group();
}

TEST(FSDPGroupedModules, TwoSiblingsShareOneGroupAndTrainLikeOneProcessAtWorlds2And3) {
  tdist::testing::expect_all_ok_at_worlds("fsdp_grouped_modules", {2, 3});
}

TEST(FSDPAbandonedStep, APendingPlacedAllGatherOutlivesItsGroupSafely) {
  tdist::testing::ProcessOptions options;
  options.timeout = std::chrono::seconds(120);
  auto results = tdist::testing::run_ranks_as_processes("fsdp_abandoned_step", 2, options);
  tdist::testing::expect_all_ok(results);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_NE(results[0].output.find("tdist FSDP warning: module 'b' was destroyed while its "
                                   "all-gather was still in flight"),
            std::string::npos)
      << results[0].output;
}

// ---- drivers ------------------------------------------------------------------------------

struct Case {
  const char* scenario;
  int world;
  std::map<std::string, std::string> env;
  const char* name;
};

class FSDPFeature : public ::testing::TestWithParam<Case> {};

TEST_P(FSDPFeature, MatchesReference) {
  const Case& p = GetParam();
  tdist::testing::ProcessOptions options;
  options.env = p.env;
  options.timeout = std::chrono::seconds(240);
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes(p.scenario, p.world, options));
}

INSTANTIATE_TEST_SUITE_P(
    All, FSDPFeature,
    ::testing::Values(Case{"fsdp_mixed_precision", 2, {}, "mixed_precision_w2"},
                      Case{"fsdp_mixed_precision", 3, {}, "mixed_precision_w3"},
                      Case{"fsdp_offload", 2, {}, "offload_w2"},
                      Case{"fsdp_offload_fused_adamw", 3, {}, "offload_fused_adamw_w3"},
                      Case{"fsdp_hsdp", 4, {{"FT_SHARD", "2"}}, "hsdp_2x2_w4"},
                      Case{"fsdp_hsdp", 2, {{"FT_SHARD", "1"}}, "hsdp_2x1_w2"},
                      Case{"fsdp_hsdp", 3, {{"FT_SHARD", "3"}}, "hsdp_1x3_w3"},
                      Case{"fsdp_no_sync", 2, {}, "no_sync_w2"},
                      Case{"fsdp_no_sync", 3, {}, "no_sync_w3"},
                      Case{"fsdp_explicit_prefetch", 2, {}, "explicit_prefetch_w2"},
                      Case{"fsdp_summon", 3, {}, "summon_w3"},
                      Case{"fsdp_summon", 4, {}, "summon_w4"},
                      Case{"fsdp_frozen", 2, {}, "frozen_w2"}, Case{"fsdp_clip", 1, {}, "clip_w1"},
                      Case{"fsdp_clip", 2, {}, "clip_w2"}, Case{"fsdp_clip", 3, {}, "clip_w3"},
                      Case{"fsdp_clip", 4, {}, "clip_w4"}, Case{"fsdp_join", 2, {}, "join_w2"},
                      Case{"fsdp_join", 3, {}, "join_w3"},
                      Case{"fsdp_join", 3, {{"FT_RESHARD", "false"}}, "join_zero2_w3"},
                      Case{"fsdp_join", 4, {{"FT_RESHARD", "2"}}, "join_int2_w4"}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tdist::fsdp

// Memory, in bytes: unsharded storage is really freed after forward/backward, and per-rank
// model state (parameters + gradients + AdamW state) is 1/N of the unsharded model's.
#include <gtest/gtest.h>

#include <unordered_set>

#include "fsdp/tiny_transformer.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/detail/fsdp/shard_layout.h"
#include "tdist/error.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/state_dict.h"
#include "tdist/mesh/device_mesh.h"

namespace tdist::fsdp {
namespace {

using testing::TinyConfig;

TinyConfig wide_config() {
  TinyConfig c;
  c.width = 64;
  c.heads = 4;
  c.hidden = 256;
  c.vocab = 128;
  return c;
}

// Bytes of distinct storages behind `tensors`.
size_t unique_storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  size_t total = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second) total += t.storage().nbytes();
  }
  return total;
}

TDIST_SCENARIO(fsdp_memory) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size();
  const int rank = get_rank();
  const TinyConfig c = wide_config();

  // Unsharded sizes from an untouched copy.
  int64_t psi = 0, padded_psi = 0;
  for (const auto& p : testing::make_tiny(c)->parameters()) {
    psi += p.numel();
    padded_psi += ShardLayout::compute(p.sizes().vec(), world, rank).padded_shard_numel();
  }

  for (bool reshard : {true, false}) {
    auto model = testing::make_tiny(c);
    std::vector<FSDPModule> blocks;
    for (auto& block : model->blocks) {
      blocks.push_back(fully_shard(block, FullyShardOptions().reshard_after_forward(reshard)));
    }
    FSDPModule root = fully_shard(model, FullyShardOptions().reshard_after_forward(reshard));
    for (auto& b : blocks) EXPECT_EQ(b.unsharded_bytes(), 0u) << "sharded right after fully_shard";
    auto opt = torch::optim::AdamW(model->parameters(), torch::optim::AdamWOptions(1e-3));
    auto [x, y] = testing::tiny_batch(c, 2 * world, 0);
    x = x.narrow(0, 2 * rank, 2);
    y = y.narrow(0, 2 * rank, 2);
    auto loss = testing::lm_loss(tdist::fsdp::forward(model, x), y);
    for (auto& b : blocks) {
      if (reshard) {
        EXPECT_EQ(b.unsharded_bytes(), 0u) << b.label() << ": freed after its forward";
        EXPECT_FALSE(b.is_unsharded());
      } else {
        EXPECT_GT(b.unsharded_bytes(), 0u) << b.label() << ": kept for backward (ZeRO-2)";
        EXPECT_TRUE(b.is_unsharded());
      }
    }
    loss.backward();
    for (auto& b : blocks) EXPECT_EQ(b.unsharded_bytes(), 0u) << b.label() << " after backward";
    EXPECT_EQ(root.unsharded_bytes(), 0u) << "root after backward";
    opt.step();

    // Model state per rank vs 16 bytes * psi / N (fp32 param + grad + Adam m and v).
    std::vector<at::Tensor> params, grads, states;
    for (const auto& p : model->parameters()) {
      params.push_back(p);
      grads.push_back(p.grad());
    }
    for (const auto& kv : opt.state()) {
      auto& s = static_cast<torch::optim::AdamWParamState&>(*kv.second);
      states.push_back(s.exp_avg());
      states.push_back(s.exp_avg_sq());
    }
    const double measured = static_cast<double>(
        unique_storage_bytes(params) + unique_storage_bytes(grads) + unique_storage_bytes(states));
    const double ideal = 16.0 * static_cast<double>(psi) / world;
    const double with_padding = 16.0 * static_cast<double>(padded_psi);
    std::cout << "rank " << rank << " reshard " << reshard << ": model state " << measured
              << " B, 16*psi/N " << ideal << " B, padded " << with_padding << " B" << std::endl;
    EXPECT_LE(measured, 1.05 * with_padding);
    EXPECT_GE(measured, 0.95 * ideal);
    EXPECT_LE(with_padding, 1.05 * ideal) << "padding of the wide model is small";
  }
  destroy_process_group();
}

TEST(FSDPMemory, UnshardedFreedAndStateIsOneOverN) {
  tdist::testing::expect_all_ok_at_worlds("fsdp_memory", {2, 3, 4});
}

// FSDP2's runtime controls, each tested by what it changes: set_reshard_after_forward(false)
// keeps the blocks' parameters unsharded from forward to backward, so backward issues no
// all-gather for them, with the same gradients; set_gradient_divide_factor(1) sums instead of
// averaging over the data-parallel ranks.
TDIST_SCENARIO(fsdp_runtime_controls) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size(), rank = get_rank();
  const TinyConfig c = wide_config();
  auto model = testing::make_tiny(c);
  std::vector<FSDPModule> blocks;
  for (auto& block : model->blocks) blocks.push_back(fully_shard(block));
  FSDPModule root = fully_shard(model);
  auto [x, y] = testing::tiny_batch(c, 2 * world, 0);
  x = x.narrow(0, 2 * rank, 2);
  y = y.narrow(0, 2 * rank, 2);
  // One forward and backward; the gradients, and how many all-gathers the blocks issued in
  // backward and held unsharded bytes between forward and backward.
  struct Step {
    std::vector<at::Tensor> grads;
    int64_t backward_all_gathers = 0;
    size_t held_after_forward = 0;
  };
  auto step = [&] {
    Step s;
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    auto loss = testing::lm_loss(tdist::fsdp::forward(model, x), y);
    int64_t before = 0;
    for (auto& b : blocks) {
      s.held_after_forward += b.unsharded_bytes();
      before += b.stats().all_gathers;
    }
    loss.backward();
    for (auto& b : blocks) s.backward_all_gathers += b.stats().all_gathers;
    s.backward_all_gathers -= before;
    for (auto& p : model->parameters()) s.grads.push_back(p.grad().clone());
    return s;
  };
  const Step by_default = step();
  EXPECT_EQ(by_default.held_after_forward, 0u);
  EXPECT_EQ(by_default.backward_all_gathers, static_cast<int64_t>(blocks.size()));

  root.set_reshard_after_forward(false);
  const Step kept = step();
  EXPECT_GT(kept.held_after_forward, 0u);
  EXPECT_EQ(kept.backward_all_gathers, 0);
  for (size_t i = 0; i < kept.grads.size(); ++i) {
    EXPECT_TRUE(kept.grads[i].equal(by_default.grads[i])) << "parameter " << i;
  }
  root.set_reshard_after_forward(true);
  EXPECT_EQ(step().held_after_forward, 0u);

  root.set_gradient_divide_factor(1.0);
  for (auto& b : blocks) b.set_gradient_divide_factor(1.0);
  const Step summed = step();
  for (size_t i = 0; i < summed.grads.size(); ++i) {
    EXPECT_TRUE(torch::allclose(summed.grads[i], by_default.grads[i] * world, 1e-5, 1e-7))
        << "parameter " << i;
  }
  EXPECT_THROW(root.set_gradient_divide_factor(0.0), InvalidArgument);
  destroy_process_group();
}

// forward_method (FSDP2's register_fsdp_forward_method): another method of a sharded module
// runs with its parameters unsharded, reshards after, and its gradients are reduced: one SGD
// step through it gives the single-process model's parameters.
struct TwoHeadedImpl : torch::nn::Module {
  TwoHeadedImpl() {
    torch::manual_seed(11);
    proj = register_module("proj", torch::nn::Linear(6, 5));
  }
  at::Tensor forward(const at::Tensor& x) { return proj->forward(x); }
  at::Tensor scaled(const at::Tensor& x, double scale) { return proj->forward(x).tanh() * scale; }
  torch::nn::Linear proj{nullptr};
};
TORCH_MODULE(TwoHeaded);

TDIST_SCENARIO(fsdp_forward_method) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({4, 6});  // the same batch on every rank
  TwoHeaded reference;
  auto ref_opt = torch::optim::SGD(reference->parameters(), torch::optim::SGDOptions(0.5));
  reference->scaled(x, 3.0).pow(2).sum().backward();
  ref_opt.step();

  TwoHeaded model;
  FSDPModule handle = fully_shard(model);
  auto opt = torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(0.5));
  at::Tensor out = forward_method(model, &TwoHeadedImpl::scaled, x, 3.0);
  out.pow(2).sum().backward();
  EXPECT_EQ(handle.unsharded_bytes(), 0u) << "resharded after backward";
  opt.step();
  const auto full = get_model_state_dict(*model, StateDictOptions().full_state_dict(true));
  for (const auto& item : reference->named_parameters()) {
    ASSERT_TRUE(full.count(item.key())) << item.key();
    EXPECT_TRUE(torch::allclose(full.at(item.key()).local, item.value(), 1e-6, 1e-7)) << item.key();
  }
  destroy_process_group();
}

// An embedding and a head: the embedding's backward reads no parameter.
struct EmbeddedImpl : torch::nn::Module {
  EmbeddedImpl() {
    torch::manual_seed(17);
    emb = register_module("emb", torch::nn::Embedding(13, 6));
    head = register_module("head", torch::nn::Linear(6, 13));
  }
  at::Tensor forward(const at::Tensor& ids) {
    return head->forward(tdist::fsdp::forward(emb, ids).tanh());
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Embedded);

// The global batch of the unshard-in-backward and all-reduce-hook scenarios, 2 rows a rank.
std::pair<at::Tensor, at::Tensor> embedded_batch(int world) {
  torch::manual_seed(23);
  return {torch::randint(0, 13, {2 * world, 5}), torch::randint(0, 13, {2 * world, 5})};
}

at::Tensor embedded_loss(Embedded& model, const at::Tensor& ids, const at::Tensor& targets,
                         bool sharded) {
  const at::Tensor logits = sharded ? tdist::fsdp::forward(model, ids) : model->forward(ids);
  return torch::nn::functional::cross_entropy(logits.flatten(0, 1), targets.flatten());
}

// The full parameters of a sharded Embedded equal `reference`'s.
void expect_full_params_equal(Embedded& model, Embedded& reference, const std::string& when) {
  const auto full = get_model_state_dict(*model, StateDictOptions().full_state_dict(true));
  for (const auto& item : reference->named_parameters()) {
    ASSERT_TRUE(full.count(item.key())) << item.key();
    EXPECT_TRUE(torch::allclose(full.at(item.key()).local, item.value(), 1e-6, 1e-7))
        << item.key() << " " << when;
  }
}

// set_unshard_in_backward(false) on the embedding (Note [Backward without parameters]): its
// backward all-gathers nothing, and two SGD steps give the single process's parameters.
TDIST_SCENARIO(fsdp_unshard_in_backward) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size(), rank = get_rank();
  const auto [ids, targets] = embedded_batch(world);
  Embedded reference, model;
  FSDPModule emb = fully_shard(model->emb);
  fully_shard(model);
  emb.set_unshard_in_backward(false);
  auto ref_opt = torch::optim::SGD(reference->parameters(), torch::optim::SGDOptions(0.5));
  auto opt = torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(0.5));
  for (int step = 0; step < 2; ++step) {
    embedded_loss(reference, ids, targets, false).backward();
    ref_opt.step();
    ref_opt.zero_grad();
    const int64_t gathered = emb.stats().all_gathers;
    embedded_loss(model, ids.narrow(0, 2 * rank, 2), targets.narrow(0, 2 * rank, 2), true)
        .backward();
    EXPECT_EQ(emb.stats().all_gathers - gathered, 1) << "forward only, step " << step;
    EXPECT_EQ(emb.unsharded_bytes(), 0u);
    EXPECT_EQ(model->emb->weight.sizes(), model->emb->weight.grad().sizes()) << "sharded again";
    opt.step();
    opt.zero_grad();
  }
  expect_full_params_equal(model, reference, "after 2 steps");
  destroy_process_group();
}

// set_all_reduce_hook: FSDP over pairs of ranks, each pair a replica; the hook averages the
// reduced shard over the replicas (HSDP by hand), so two SGD steps give the single
// process's parameters over the global batch. It sees the averaged shard, once per backward.
TDIST_SCENARIO(fsdp_all_reduce_hook) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size(), rank = get_rank();
  auto mesh = tdist::mesh::init_device_mesh("cpu", {world / 2, 2}, {"replicate", "shard"});
  const ProcessGroupPtr replicas = mesh.get_group("replicate");
  const auto [ids, targets] = embedded_batch(world);
  Embedded reference, model;
  FSDPModule emb = fully_shard(model->emb, FullyShardOptions().mesh(mesh["shard"]));
  FSDPModule root = fully_shard(model, FullyShardOptions().mesh(mesh["shard"]));
  int calls = 0;
  const AllReduceHook average_replicas = [&](const at::Tensor& reduce_output) {
    ++calls;
    all_reduce(reduce_output, ReduceOp::AVG, replicas);
  };
  emb.set_all_reduce_hook(average_replicas);
  root.set_all_reduce_hook(average_replicas);
  auto ref_opt = torch::optim::SGD(reference->parameters(), torch::optim::SGDOptions(0.5));
  auto opt = torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(0.5));
  for (int step = 0; step < 2; ++step) {
    embedded_loss(reference, ids, targets, false).backward();
    ref_opt.step();
    ref_opt.zero_grad();
    embedded_loss(model, ids.narrow(0, 2 * rank, 2), targets.narrow(0, 2 * rank, 2), true)
        .backward();
    opt.step();
    opt.zero_grad();
  }
  EXPECT_EQ(calls, 4) << "two groups, two backwards";
  expect_full_params_equal(model, reference, "after 2 steps");
  destroy_process_group();
}

TEST(FSDPRuntimeControls, UnshardInBackwardFalseGathersTheEmbeddingInForwardOnly) {
  tdist::testing::expect_all_ok_at_worlds("fsdp_unshard_in_backward", {1, 2, 3});
}

TEST(FSDPRuntimeControls, AllReduceHookReplicatesByHandAtWorlds2And4) {
  tdist::testing::expect_all_ok_at_worlds("fsdp_all_reduce_hook", {2, 4});
}

TEST(FSDPRuntimeControls, ForwardMethodUnshardsAndReducesAtWorlds2And3) {
  tdist::testing::expect_all_ok_at_worlds("fsdp_forward_method", {2, 3});
}

TEST(FSDPRuntimeControls, ReshardAfterForwardAndGradientDivideFactorAtWorlds2And3) {
  tdist::testing::expect_all_ok_at_worlds("fsdp_runtime_controls", {2, 3});
}

// set_reshard_after_backward(false) over gradient accumulation (Note [Unsharded after
// backward]): after each backward without sync the parameters stay unsharded (full shapes,
// bytes held, no gradient showing), so the next microbatch's forward all-gathers nothing;
// the synced last microbatch reshards, and training matches the same model accumulating with
// resharding, bit for bit.
TDIST_SCENARIO(fsdp_reshard_after_backward) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size(), rank = get_rank();
  const TinyConfig c = wide_config();
  auto shard_all = [](testing::TinyTransformer& m, std::vector<FSDPModule>& blocks) {
    for (auto& block : m->blocks) blocks.push_back(fully_shard(block));
    return fully_shard(m);
  };
  auto model = testing::make_tiny(c);
  auto plain = testing::make_tiny(c);
  std::vector<FSDPModule> blocks, plain_blocks;
  FSDPModule root = shard_all(model, blocks);
  FSDPModule plain_root = shard_all(plain, plain_blocks);
  auto opt = torch::optim::AdamW(model->parameters(), torch::optim::AdamWOptions(1e-2));
  auto plain_opt = torch::optim::AdamW(plain->parameters(), torch::optim::AdamWOptions(1e-2));
  auto gathers = [](const std::vector<FSDPModule>& handles) {
    int64_t n = 0;
    for (const auto& h : handles) n += h.stats().all_gathers;
    return n;
  };
  const auto full_shape = model->blocks[0]->fc1->weight.sizes().vec();  // at rest: a shard
  constexpr int kMicrobatches = 3;
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    plain_opt.zero_grad();
    const int64_t gathered = gathers(blocks), plain_gathered = gathers(plain_blocks);
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      const bool last = mb == kMicrobatches - 1;
      root.set_requires_gradient_sync(last);
      root.set_reshard_after_backward(last);
      plain_root.set_requires_gradient_sync(last);
      auto [x, y] = testing::tiny_batch(c, 2 * world, 10 * step + mb);
      x = x.narrow(0, 2 * rank, 2);
      y = y.narrow(0, 2 * rank, 2);
      testing::lm_loss(tdist::fsdp::forward(model, x), y).backward();
      testing::lm_loss(tdist::fsdp::forward(plain, x), y).backward();
      size_t held = 0;
      for (const auto& b : blocks) held += b.unsharded_bytes();
      if (last) {
        EXPECT_EQ(held, 0u) << "the synced backward reshards";
      } else {
        EXPECT_GT(held, 0u) << "microbatch " << mb;
        EXPECT_NE(model->blocks[0]->fc1->weight.sizes().vec(), full_shape) << "holds full data";
        for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
      }
    }
    // Per block: the first microbatch gathers in forward and backward, the others only in
    // backward (their forward finds the parameters kept); resharding gathers twice each.
    EXPECT_EQ(gathers(blocks) - gathered, static_cast<int64_t>(blocks.size()) * 4);
    EXPECT_EQ(gathers(plain_blocks) - plain_gathered,
              static_cast<int64_t>(blocks.size()) * 2 * kMicrobatches);
    opt.step();
    plain_opt.step();
  }
  auto plain_params = plain->named_parameters();
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(item.value().sizes(), plain_params[item.key()].sizes()) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), plain_params[item.key()])) << item.key();
  }
  destroy_process_group();
}

TEST(FSDPRuntimeControls, ReshardAfterBackwardFalseSavesForwardAllGathersAtWorlds2And3) {
  tdist::testing::expect_all_ok_at_worlds("fsdp_reshard_after_backward", {2, 3});
}

// Two microbatches of gradient accumulation with the controls FSDP2 has for them:
//  - set_requires_all_reduce(false) (HSDP, FSDP_HSDP_SHARD ranks per replica): the first
//    backward issues no replica all-reduce and leaves no gradient on the parameters; the
//    second all-reduces the sum once per group, and the gradients are the default's.
//  - set_is_last_backward(false) (set on a block, which sets the root's): the first
//    backward returns with the last reduce-scatter still in flight (some parameter has no
//    gradient yet); after the second, with it true, the gradients are bitwise the default's.
TDIST_SCENARIO(fsdp_accumulation_controls) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const int world = get_world_size(), rank = get_rank();
  const int shard = std::atoi(tdist::testing::env_str("FSDP_HSDP_SHARD", "0").c_str());
  const TinyConfig c = wide_config();
  auto model = testing::make_tiny(c);
  FullyShardOptions options;
  if (shard > 0) {
    options.mesh(mesh::init_device_mesh("cpu", {world / shard, shard}, {"replicate", "shard"}));
  }
  std::vector<FSDPModule> groups;
  for (auto& block : model->blocks) groups.push_back(fully_shard(block, options));
  FSDPModule root = fully_shard(model, options);
  groups.push_back(root);
  auto all_reduces = [&] {
    int64_t n = 0;
    for (auto& g : groups) n += g.stats().all_reduces;
    return n;
  };
  auto micro = [&](int i) {
    auto [x, y] = testing::tiny_batch(c, 2 * world, i);
    testing::lm_loss(tdist::fsdp::forward(model, x.narrow(0, 2 * rank, 2)),
                     y.narrow(0, 2 * rank, 2))
        .backward();
  };
  auto clear_grads = [&] {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
  };
  auto grads = [&] {
    std::vector<at::Tensor> out;
    for (auto& p : model->parameters())
      out.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
    return out;
  };
  auto defined = [](const std::vector<at::Tensor>& g) {
    int64_t n = 0;
    for (const auto& t : g) n += t.defined();
    return n;
  };
  const int64_t n_params = static_cast<int64_t>(model->parameters().size());
  const int64_t n_groups = static_cast<int64_t>(groups.size());
  const bool hsdp = shard > 0 && world / shard > 1;

  clear_grads();
  int64_t before = all_reduces();
  micro(0);
  EXPECT_EQ(defined(grads()), n_params);
  micro(1);
  const std::vector<at::Tensor> by_default = grads();
  EXPECT_EQ(all_reduces() - before, hsdp ? 2 * n_groups : 0);

  if (hsdp) {
    clear_grads();
    before = all_reduces();
    root.set_requires_all_reduce(false);
    micro(0);
    EXPECT_EQ(all_reduces() - before, 0);
    EXPECT_EQ(defined(grads()), 0) << "the skipped all-reduce's gradients are held back";
    root.set_requires_all_reduce(true);
    micro(1);
    EXPECT_EQ(all_reduces() - before, n_groups);
    const auto summed_once = grads();
    for (size_t i = 0; i < summed_once.size(); ++i) {
      EXPECT_TRUE(torch::allclose(summed_once[i], by_default[i], 1e-5, 1e-7)) << "parameter " << i;
    }
  }

  clear_grads();
  groups.front().set_is_last_backward(false);  // set on a block: the tree's, as FSDP2's
  micro(0);
  EXPECT_LT(defined(grads()), n_params) << "the last reduce-scatter is still in flight";
  root.set_is_last_backward(true);
  micro(1);
  const auto delayed = grads();
  for (size_t i = 0; i < delayed.size(); ++i) {
    EXPECT_TRUE(delayed[i].equal(by_default[i])) << "parameter " << i;
  }
  destroy_process_group();
}

TEST(FSDPRuntimeControls, RequiresAllReduceAndIsLastBackwardInGradientAccumulation) {
  struct Case {
    int world;
    const char* shard;  // "0": plain FSDP
  };
  for (const Case& c : {Case{4, "2"}, Case{2, "1"}, Case{3, "0"}}) {
    SCOPED_TRACE(::testing::Message() << "world " << c.world << " shard " << c.shard);
    tdist::testing::ProcessOptions options;
    options.env = {{"FSDP_HSDP_SHARD", c.shard}};
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("fsdp_accumulation_controls", c.world, options));
  }
}

}  // namespace
}  // namespace tdist::fsdp

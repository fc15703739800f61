// Tensor-parallel styles against the same modules in one process: column- then row-parallel
// Linear (with biases, uneven shards at worlds 3 and 4) including an optimizer step on the
// shards, vocabulary- and embedding-dim-parallel Embedding, loss_parallel, the Megatron
// sequence-parallel pattern (reduce-scatter into a sequence-parallel LayerNorm, all-gather
// out of it), wildcard plans, and the errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect.h"
#include "support/ranks.h"
#include "support/tensors.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/flight_recorder.h"
#include "tdist/error.h"
#include "tdist/mesh/device_mesh.h"
#include "tdist/tensor/parallel/parallelize.h"

namespace {

using namespace tdist::testing;
using tdist::mesh::DeviceMesh;
using tdist::mesh::init_device_mesh;
using namespace tdist::tensor;
using namespace tdist::tensor::parallel;
namespace tp = tdist::tensor::parallel;

int world_size() {
  return env_int("WORLD_SIZE", 1);
}

// This rank's torch.chunk piece of `t` along `dim` (the oracle for shards).
at::Tensor chunk_of(const at::Tensor& t, int64_t dim, const DeviceMesh& mesh) {
  return chunk_piece(t, dim, mesh.size(), mesh.get_local_rank());
}

void expect_close(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  tdist::testing::expect_close(a, b, what, 1e-10);
}

struct MLPImpl : torch::nn::Module {
  MLPImpl() {
    up = register_module("up", torch::nn::Linear(6, 10));
    down = register_module("down", torch::nn::Linear(10, 6));
  }
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(MLP);

MLP make_mlp() {
  torch::manual_seed(5);
  MLP m;
  m->to(torch::kDouble);
  return m;
}

TDIST_SCENARIO(colwise_rowwise_mlp) {
  DeviceMesh mesh = init_device_mesh("cpu", {world_size()});
  MLP ref = make_mlp(), model = make_mlp();
  parallelize_module(model.ptr(), mesh,
                     ParallelizePlan{{"up", ColwiseParallel()}, {"down", RowwiseParallel()}});
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({4, 3, 6}, torch::kDouble);
  const at::Tensor target = torch::randn({4, 3, 6}, torch::kDouble);

  at::Tensor rx = x.clone().requires_grad_(true);
  const at::Tensor ref_loss = (ref->down(torch::relu(ref->up(rx))) * target).sum();
  ref_loss.backward();

  at::Tensor lx = x.clone().requires_grad_(true);
  const at::Tensor hidden = torch::relu(tp::forward(model->up, lx));
  EXPECT_EQ(hidden.size(-1), chunk_of(ref->up->weight, 0, mesh).size(0));
  const at::Tensor loss = (tp::forward(model->down, hidden) * target).sum();
  loss.backward();

  EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-10);
  expect_close(lx.grad(), rx.grad(), "input gradient");
  expect_close(model->up->weight.grad(), chunk_of(ref->up->weight.grad(), 0, mesh), "up.weight");
  expect_close(model->up->bias.grad(), chunk_of(ref->up->bias.grad(), 0, mesh), "up.bias");
  expect_close(model->down->weight.grad(), chunk_of(ref->down->weight.grad(), 1, mesh),
               "down.weight");
  expect_close(model->down->bias.grad(), ref->down->bias.grad(), "down.bias");
  expect_close(parameter_dtensor(*model->up, "weight").full_tensor(), ref->up->weight, "layout");

  // The optimizer steps the shards; gathered, they are the single process's parameters.
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ref_opt.step();
  opt.step();
  expect_close(parameter_dtensor(*model->down, "weight").full_tensor(), ref->down->weight,
               "down.weight after a step");
  expect_close(parameter_dtensor(*model->up, "bias").full_tensor(), ref->up->bias,
               "up.bias after a step");
  tdist::destroy_process_group();
}

struct TinyLMImpl : torch::nn::Module {
  TinyLMImpl() {
    embed = register_module("embed", torch::nn::Embedding(11, 6));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(6, 11).bias(false)));
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TinyLM);

TinyLM make_lm() {
  torch::manual_seed(8);
  TinyLM m;
  m->to(torch::kDouble);
  return m;
}

// A vocabulary-parallel embedding and a column-parallel head whose sharded logits go
// straight into loss_parallel, against embedding + linear + cross_entropy.
TDIST_SCENARIO(vocab_parallel_lm) {
  DeviceMesh mesh = init_device_mesh("cpu", {world_size()});
  TinyLM ref = make_lm(), model = make_lm();
  parallelize_module(model.ptr(), mesh,
                     ParallelizePlan{{"embed", RowwiseParallel()},
                                     {"head", ColwiseParallel().use_local_output(false)}});
  const at::Tensor ids = torch::tensor({{0, 3, 10, 7}, {5, 5, 1, 9}}, torch::kLong);
  const at::Tensor labels = torch::tensor({3, 10, 7, -100, 5, 1, 9, 2}, torch::kLong);

  const at::Tensor ref_logits = ref->head(ref->embed(ids)).flatten(0, 1);
  const at::Tensor ref_loss = torch::nn::functional::cross_entropy(ref_logits, labels);
  ref_loss.backward();

  const at::Tensor h = tp::forward(model->embed, ids);
  const DTensor logits = forward_dtensor(model->head, h.flatten(0, 1));
  EXPECT_EQ(logits.placements(), (Placements{Shard(1)}));
  const at::Tensor loss = loss_parallel_cross_entropy(logits, labels);
  loss.backward();
  EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-10);
  expect_close(model->embed->weight.grad(), chunk_of(ref->embed->weight.grad(), 0, mesh),
               "embed.weight (vocabulary rows)");
  expect_close(model->head->weight.grad(), chunk_of(ref->head->weight.grad(), 0, mesh),
               "head.weight");
  // A target outside the classes, and logits not sharded along them, are named.
  expect_invalid_argument([&] { loss_parallel_cross_entropy(logits, labels + 20); },
                          "outside [0, 11)");
  expect_invalid_argument(
      [&] { loss_parallel_cross_entropy(logits.redistribute({Replicate()}), labels); },
      "sharded along the classes");
  const at::Tensor none =
      loss_parallel_cross_entropy(logits, labels, LossParallelOptions().reduction("none"));
  expect_close(none,
               torch::nn::functional::cross_entropy(
                   ref_logits, labels,
                   torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone)),
               "per-row losses");
  tdist::destroy_process_group();
}

TDIST_SCENARIO(colwise_embedding) {
  DeviceMesh mesh = init_device_mesh("cpu", {world_size()});
  TinyLM ref = make_lm(), model = make_lm();
  parallelize_module(model->embed.ptr(), mesh, ColwiseParallel().output_layouts(Replicate()));
  const at::Tensor ids = torch::tensor({{0, 3, 10, 7}, {5, 5, 1, 9}}, torch::kLong);
  const at::Tensor weights = torch::linspace(-1, 1, 2 * 4 * 6, torch::kDouble).view({2, 4, 6});
  (ref->embed(ids) * weights).sum().backward();
  const at::Tensor out = tp::forward(model->embed, ids);
  expect_close(out, ref->embed(ids), "replicated embedding output");
  (out * weights).sum().backward();
  expect_close(model->embed->weight.grad(), chunk_of(ref->embed->weight.grad(), 1, mesh),
               "embedding columns");
  tdist::destroy_process_group();
}

struct SPBlockImpl : torch::nn::Module {
  SPBlockImpl() {
    proj = register_module("proj", torch::nn::Linear(8, 6));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
    out = register_module("out", torch::nn::Linear(6, 8));
  }
  torch::nn::Linear proj{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(SPBlock);

SPBlock make_block() {
  torch::manual_seed(9);
  SPBlock m;
  m->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  m->norm->weight.uniform_(0.5, 1.5);  // not the default ones, so its gradient is tested
  m->norm->bias.uniform_(-0.5, 0.5);
  return m;
}

// Megatron's sequence parallelism: the row-parallel projection reduce-scatters onto
// sequence shards, the LayerNorm runs on them, the column-parallel output gathers them.
TDIST_SCENARIO(sequence_parallel_block) {
  DeviceMesh mesh = init_device_mesh("cpu", {world_size()});
  SPBlock ref = make_block(), model = make_block();
  parallelize_module(
      model.ptr(), mesh,
      ParallelizePlan{
          {"proj", RowwiseParallel().input_layouts(Replicate()).output_layouts(Shard(1))},
          {"norm", SequenceParallel()},
          {"out", ColwiseParallel().input_layouts(Shard(1)).output_layouts(Replicate())}});
  torch::manual_seed(10);
  const int64_t seq = 2 * world_size();  // even sequence shards, as from_local assumes
  const at::Tensor x = torch::randn({3, seq, 8}, torch::kDouble);
  const at::Tensor target = torch::randn({3, seq, 8}, torch::kDouble);
  at::Tensor rx = x.clone().requires_grad_(true);
  (ref->out(ref->norm(ref->proj(rx))) * target).sum().backward();

  at::Tensor lx = x.clone().requires_grad_(true);
  const at::Tensor shard = tp::forward(model->proj, lx);
  EXPECT_EQ(shard.size(1), 2);
  const at::Tensor y = tp::forward(model->out, tp::forward(model->norm, shard));
  (y * target).sum().backward();
  expect_close(lx.grad(), rx.grad(), "input gradient");
  expect_close(model->norm->weight.grad(), ref->norm->weight.grad(), "norm.weight (all-reduced)");
  expect_close(model->norm->bias.grad(), ref->norm->bias.grad(), "norm.bias (all-reduced)");
  expect_close(model->proj->bias.grad(), ref->proj->bias.grad(), "proj.bias (all-reduced)");
  expect_close(model->proj->weight.grad(), chunk_of(ref->proj->weight.grad(), 1, mesh),
               "proj.weight");
  expect_close(model->out->weight.grad(), chunk_of(ref->out->weight.grad(), 0, mesh), "out.weight");
  tdist::destroy_process_group();
}

// Two column-parallel projections of one prepared input (attention's q/k/v pattern).
struct PairImpl : torch::nn::Module {
  PairImpl() {
    a = register_module("a", torch::nn::Linear(8, 6));
    b = register_module("b", torch::nn::Linear(8, 6));
  }
  at::Tensor forward(const at::Tensor& x) {
    const bool parallel = tp::style_of(*a) != nullptr;
    return parallel ? tp::forward(a, x) * tp::forward(b, x) : a(x) * b(x);
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(Pair);

// The collectives of `op` in the records after `after`.
int64_t count_after(uint64_t after, const std::string& op) {
  int64_t n = 0;
  for (const auto& r : tdist::flight_recorder_records()) n += r.id > after && r.op == op;
  return n;
}

uint64_t last_record_id() {
  const auto records = tdist::flight_recorder_records();
  return records.empty() ? 0 : records.back().id;
}

// PrepareModuleInput's gather-once mode: a sequence-sharded input gathered once for two
// column-parallel consumers whose input gradients are summed and reduce-scattered once; the
// default mode gives the same gradients with one all-reduce per consumer.
TDIST_SCENARIO(prepare_input_gathers_once) {
  DeviceMesh mesh = init_device_mesh("cpu", {world_size()});
  const int64_t seq = 2 * world_size();
  torch::manual_seed(12);
  const at::Tensor x = torch::randn({3, seq, 8}, torch::kDouble);
  const at::Tensor target = torch::randn({3, seq, 6}, torch::kDouble);
  torch::manual_seed(6);
  Pair ref;
  ref->to(torch::kDouble);
  at::Tensor rx = x.clone().requires_grad_(true);
  (ref->forward(rx) * target).sum().backward();
  for (const bool once : {true, false}) {
    torch::manual_seed(6);
    Pair model;
    model->to(torch::kDouble);
    parallelize_module(model.ptr(), mesh,
                       PrepareModuleInput()
                           .input_layouts(Shard(1))
                           .desired_input_layouts(Replicate())
                           .use_local_output(!once));
    const ColwiseParallel gathered = ColwiseParallel().output_layouts(Replicate());
    parallelize_module(model->a.ptr(), mesh, gathered);
    parallelize_module(model->b.ptr(), mesh, gathered);
    at::Tensor lx = chunk_of(x, 1, mesh).clone().requires_grad_(true);
    const at::Tensor y = tp::forward(model, lx);
    const uint64_t before_backward = last_record_id();
    (y * target).sum().backward();
    const std::string mode = once ? "gather once" : "default";
    expect_close(lx.grad(), chunk_of(rx.grad(), 1, mesh), mode + ": input gradient");
    expect_close(model->b->weight.grad(), chunk_of(ref->b->weight.grad(), 0, mesh),
                 mode + ": b.weight");
    if (world_size() > 1) {
      EXPECT_EQ(count_after(before_backward, "reduce_scatter_tensor"), once ? 1 : 0) << mode;
      EXPECT_EQ(count_after(before_backward, "all_reduce"), once ? 0 : 2) << mode;
    }
  }
  tdist::destroy_process_group();
}

struct StackImpl : torch::nn::Module {
  StackImpl() {
    layers = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < 3; ++i) layers->push_back(MLP());
  }
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(Stack);

TDIST_SCENARIO(plans_and_errors) {
  DeviceMesh mesh = init_device_mesh("cpu", {world_size()});
  Stack stack;
  parallelize_module(stack.ptr(), mesh, ParallelizePlan{{"layers.*.up", ColwiseParallel()}});
  for (const auto& layer : *stack->layers) {
    const auto* mlp = layer->as<MLPImpl>();
    EXPECT_NE(style_of(*mlp->up), nullptr);
    EXPECT_EQ(style_of(*mlp->down), nullptr);
    EXPECT_EQ(mlp->up->weight.size(0), chunk_of(torch::zeros({10}), 0, mesh).size(0));
  }
  MLP mlp;
  expect_invalid_argument(
      [&] {
        parallelize_module(mlp.ptr(), mesh, ParallelizePlan{{"upp", ColwiseParallel()}});
      },
      "plan key 'upp'");
  expect_invalid_argument([&] { parallelize_module(stack.ptr(), mesh, ColwiseParallel()); },
                          "shards Linear and Embedding");
  expect_invalid_argument(
      [&] {
        tp::forward(mlp->down, torch::ones({2, 10}));
      },
      "has no tensor-parallel style");
  parallelize_module(mlp->down.ptr(), mesh, RowwiseParallel().use_local_output(false));
  expect_invalid_argument(
      [&] {
        tp::forward(mlp->down, torch::ones({2, 10}));
      },
      "call forward_dtensor");
  expect_invalid_argument([&] { parallelize_module(mlp->down.ptr(), mesh, RowwiseParallel()); },
                          "already parallelized");
  if (world_size() == 4) {
    DeviceMesh two_d = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    expect_invalid_argument([&] { parallelize_module(mlp->up.ptr(), two_d, ColwiseParallel()); },
                            "mesh[\"tp\"]");
  }
  tdist::destroy_process_group();
}

TEST(TensorParallel, ColumnThenRowParallelLinearMatchesOneProcess) {
  expect_all_ok_at_worlds("colwise_rowwise_mlp", {1, 2, 3, 4});
}
TEST(TensorParallel, VocabularyParallelEmbeddingAndLossParallel) {
  expect_all_ok_at_worlds("vocab_parallel_lm", {1, 2, 3, 4});
}
TEST(TensorParallel, ColumnParallelEmbedding) {
  expect_all_ok_at_worlds("colwise_embedding", {2, 3});
}
TEST(TensorParallel, SequenceParallelBlock) {
  expect_all_ok_at_worlds("sequence_parallel_block", {1, 2, 3});
}
TEST(TensorParallel, PrepareModuleInputGathersOnceForColumnParallelConsumers) {
  expect_all_ok_at_worlds("prepare_input_gathers_once", {1, 2, 3});
}
TEST(TensorParallel, PlansAndErrors) {
  expect_all_ok_at_worlds("plans_and_errors", {1, 4});
}

}  // namespace

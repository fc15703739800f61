// Tensor parallelism on the Llama-like families against the same model in one process:
// logits and gradients at tp 2 and 3 (grouped-query heads, head_dim unlike hidden / heads,
// uneven MLP shards, Qwen2's q/k/v biases), and 2-D (FSDP over dp, tensor parallelism over
// tp) training steps with a clipped gradient norm at world 4.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "oracle.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "support/tensors.h"
#include "tdist/checkpoint/module_state.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/fsdp/clip_grad.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/full_params.h"
#include "tdist/mesh/device_mesh.h"
#include "tdist/models/config.h"
#include "tdist/models/pretrained.h"
#include "tdist/models/tensor_parallel.h"
#include "tdist/tensor/parallel/parallelize.h"

namespace {

using namespace tdist::testing;
namespace models = tdist::models;

int world_size() {
  return env_int("WORLD_SIZE", 1);
}

// Heads divide 2 (qwen2) or 3 (llama); both have head_dim 10 with hidden 48.
std::string config_json(const std::string& family) {
  if (family == "qwen2") {
    return R"({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 61,
      "hidden_size": 48, "intermediate_size": 42, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 10,
      "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
      "tie_word_embeddings": false, "torch_dtype": "float32"})";
  }
  return R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 61,
    "hidden_size": 48, "intermediate_size": 40, "num_hidden_layers": 2,
    "num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 10,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "torch_dtype": "float32"})";
}

std::shared_ptr<models::CausalLM> build(const models::ModelConfig& config) {
  torch::manual_seed(41);
  auto model = models::build_model(config);
  model->to(torch::kDouble);
  return model;
}

void expect_close(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  tdist::testing::expect_close(a, b, what, 1e-9);
}

// Every parameter of `model` (FSDP-sharded or not, tensor-parallel or not) gathered whole
// equals `ref`'s of the same name within 1e-6 relative; collective over the model's ranks.
void expect_parameters_equal(const models::CausalLM& model, const models::CausalLM& ref,
                             bool sharded, const std::string& when) {
  std::optional<tdist::fsdp::SummonFullParams> full;
  if (sharded) full.emplace(model, tdist::fsdp::SummonFullParamsOptions().writeback(false));
  const auto ref_params = ref.named_parameters();
  size_t compared = 0;
  for (const auto& item : model.named_modules()) {
    const bool parallel = tdist::tensor::parallel::style_of(*item.value()) != nullptr;
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      const std::string name = item.key() + "." + p.key();
      const at::Tensor whole =
          parallel
              ? tdist::tensor::parallel::parameter_dtensor(*item.value(), p.key()).full_tensor()
              : p.value();
      const at::Tensor& want = *ref_params.find(name);
      EXPECT_LE((whole - want).abs().max().item<double>(),
                1e-6 * std::max(1.0, want.abs().max().item<double>()))
          << name << " " << when;
      ++compared;
    }
  }
  EXPECT_EQ(compared, ref_params.size());
}

at::Tensor grad_of(const models::CausalLM& model, const std::string& name) {
  const auto params = model.named_parameters();
  return params.find(name)->grad();
}

// SP=0 runs the plan without sequence parallelism (and without loss parallelism).
models::TensorParallelOptions options_from_env() {
  const bool sp = env_str("SP") != "0";
  return models::TensorParallelOptions().sequence_parallel(sp).loss_parallel(sp);
}

TDIST_SCENARIO(tensor_parallel_logits) {
  const models::ModelConfig config = models::ModelConfig::from_json(config_json(env_str("FAMILY")));
  tdist::mesh::DeviceMesh mesh = tdist::mesh::init_device_mesh("cpu", {world_size()});
  auto ref = build(config), model = build(config);
  models::apply_tensor_parallel(model, mesh, options_from_env());
  const at::Tensor ids = torch::tensor({{3, 17, 60, 5, 9, 0, 41}, {8, 8, 2, 33, 59, 1, 12}});
  const at::Tensor weights = torch::linspace(-1, 1, 2 * 7 * 61, torch::kDouble).view({2, 7, 61});
  const at::Tensor ref_logits = ref->forward(ids);
  (ref_logits * weights).sum().backward();
  const at::Tensor logits = model->forward(ids);
  expect_close(logits, ref_logits, "logits");
  (logits * weights).sum().backward();
  const int64_t k = world_size(), r = tdist::get_rank();
  for (const std::string name :
       {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
        "model.layers.0.mlp.up_proj.weight", "lm_head.weight"}) {
    expect_close(grad_of(*model, name), chunk_piece(grad_of(*ref, name), 0, k, r), name);
  }
  expect_close(grad_of(*model, "model.embed_tokens.weight"),
               chunk_piece(grad_of(*ref, "model.embed_tokens.weight"), 0, k, r), "embed_tokens");
  expect_close(grad_of(*model, "model.layers.1.self_attn.o_proj.weight"),
               chunk_piece(grad_of(*ref, "model.layers.1.self_attn.o_proj.weight"), 1, k, r),
               "o_proj");
  expect_close(grad_of(*model, "model.layers.0.input_layernorm.weight"),
               grad_of(*ref, "model.layers.0.input_layernorm.weight"), "norm (replicated)");
  if (config.family == models::ModelFamily::kQwen2) {
    expect_close(grad_of(*model, "model.layers.0.self_attn.v_proj.bias"),
                 chunk_piece(grad_of(*ref, "model.layers.0.self_attn.v_proj.bias"), 0, k, r),
                 "v bias");
  }
  tdist::destroy_process_group();
}

// The training loss with the head's logits kept vocabulary-sharded (loss parallelism, on a
// sequence whose length the degree does not divide, with ignored targets): the loss and the
// gradients equal the single process's cross-entropy.
TDIST_SCENARIO(tensor_parallel_loss) {
  const models::ModelConfig config = models::ModelConfig::from_json(config_json(env_str("FAMILY")));
  tdist::mesh::DeviceMesh mesh = tdist::mesh::init_device_mesh("cpu", {world_size()});
  auto ref = build(config), model = build(config);
  models::apply_tensor_parallel(model, mesh, options_from_env());
  const at::Tensor ids = torch::tensor({{3, 17, 60, 5, 9, 0, 41, 7}, {8, 8, 2, 33, 59, 1, 12, 4}});
  const at::Tensor targets =
      torch::tensor({{17, 60, 5, -100, 0, 41, 7, 2}, {8, 2, 33, 59, 1, -100, 4, 60}});
  const at::Tensor ref_loss = torch::nn::functional::cross_entropy(
      ref->forward(ids).flatten(0, 1), targets.flatten(),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
  ref_loss.backward();
  const at::Tensor loss = model->next_token_loss(ids, targets);
  EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-9);
  loss.backward();
  const int64_t k = world_size(), r = tdist::get_rank();
  for (const std::string name :
       {"lm_head.weight", "model.embed_tokens.weight", "model.layers.1.mlp.gate_proj.weight"}) {
    expect_close(grad_of(*model, name), chunk_piece(grad_of(*ref, name), 0, k, r), name);
  }
  for (const std::string name : {"model.norm.weight", "model.layers.0.input_layernorm.weight",
                                 "model.layers.1.post_attention_layernorm.weight"}) {
    expect_close(grad_of(*model, name), grad_of(*ref, name), name + " (replicated)");
  }
  tdist::destroy_process_group();
}

// Greedy generation with a KV cache under sequence parallelism: a prompt of 5 and single
// tokens after it, each padded to the degree and the padding dropped from the cache, give
// the single process's logits at every step.
TDIST_SCENARIO(tensor_parallel_generation) {
  const models::ModelConfig config = models::ModelConfig::from_json(config_json(env_str("FAMILY")));
  tdist::mesh::DeviceMesh mesh = tdist::mesh::init_device_mesh("cpu", {world_size()});
  auto ref = build(config), model = build(config);
  models::apply_tensor_parallel(model, mesh, options_from_env());
  torch::NoGradGuard no_grad;
  models::KVCache cache, ref_cache;
  at::Tensor ids = torch::tensor({{3, 17, 60, 5, 9}});
  for (int step = 0; step < 4; ++step) {
    const at::Tensor logits = model->forward(ids, &cache);
    const at::Tensor ref_logits = ref->forward(ids, &ref_cache);
    expect_close(logits, ref_logits, "step " + std::to_string(step));
    EXPECT_EQ(cache.length(), ref_cache.length());
    ids = ref_logits.select(1, -1).argmax(-1).view({1, 1});
  }
  tdist::destroy_process_group();
}

// FSDP over dp of tensor-parallel decoder layers: five clipped AdamW steps, then every
// parameter gathered (FSDP, then tensor parallelism) equals the single process's. World 4:
// (dp 2, tp 2) on qwen2; world 3: (dp 1, tp 3) on llama.
TDIST_SCENARIO(two_d_llama) {
  const bool tp3 = world_size() == 3;
  const models::ModelConfig config =
      models::ModelConfig::from_json(config_json(tp3 ? "llama" : "qwen2"));
  const int64_t tp = tp3 ? 3 : 2, dp = world_size() / tp;
  tdist::mesh::DeviceMesh mesh = tdist::mesh::init_device_mesh("cpu", {dp, tp}, {"dp", "tp"});
  auto ref = build(config), model = build(config);
  models::apply_tensor_parallel(model, mesh["tp"], options_from_env());
  models::fully_shard_model(model, tdist::fsdp::FullyShardOptions().mesh(mesh["dp"]));
  torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  const int64_t dp_rank = mesh.get_local_rank("dp");
  for (int step = 0; step < 5; ++step) {
    torch::manual_seed(70 + step);
    const at::Tensor ids = torch::randint(0, 61, {4, 9});
    const at::Tensor labels = torch::randint(0, 61, {4, 9});
    const at::Tensor ref_loss =
        torch::nn::functional::cross_entropy(ref->forward(ids).flatten(0, 1), labels.flatten());
    ref_loss.backward();
    const double ref_norm = torch::nn::utils::clip_grad_norm_(ref->parameters(), 0.5);
    ref_opt.step();
    ref_opt.zero_grad();

    const int64_t per_rank = 4 / dp;
    const at::Tensor loss = tdist::fsdp::forward_method(
        model, &models::CausalLM::next_token_loss, ids.narrow(0, per_rank * dp_rank, per_rank),
        labels.narrow(0, per_rank * dp_rank, per_rank));
    loss.backward();
    const double norm = tdist::fsdp::clip_grad_norm_(*model, 0.5).item<double>();
    opt.step();
    opt.zero_grad();
    at::Tensor mean = loss.detach().clone();
    tdist::all_reduce(mean, tdist::ReduceOp::AVG, mesh.get_group("dp"));
    EXPECT_NEAR(mean.item<double>(), ref_loss.item<double>(), 1e-6) << "step " << step;
    EXPECT_NEAR(norm, ref_norm, 1e-6 * ref_norm) << "step " << step;
  }
  expect_parameters_equal(*model, *ref, /*sharded=*/true, "after 5 steps");
  tdist::destroy_process_group();
}

// Checkpoints across layouts (Note [Tensor-parallel slices]): a qwen2 model trained one
// AdamW step at (dp 2, tp 2) is saved; each layout loads it (LAYOUT: "dp4" FSDP alone over 4,
// "tp2" tensor parallelism alone, "single" one plain process), takes a second step, and every
// parameter equals the single process's after two steps (so the optimizer state came back).
struct Layout {
  std::shared_ptr<models::CausalLM> model;
  int64_t dp_rank = 0, dp_size = 1;
  bool sharded = false;
  std::optional<tdist::mesh::DeviceMesh> mesh;
};

Layout make_layout(const std::string& name, const models::ModelConfig& config) {
  Layout l;
  l.model = build(config);
  if (name == "single") return l;
  const int64_t tp = name == "dp4" ? 1 : (name == "tp2" ? world_size() : 2);
  l.mesh = tdist::mesh::init_device_mesh("cpu", {world_size() / tp, tp}, {"dp", "tp"});
  if (tp > 1) models::apply_tensor_parallel(l.model, (*l.mesh)["tp"]);
  models::fully_shard_model(l.model, tdist::fsdp::FullyShardOptions().mesh((*l.mesh)["dp"]));
  l.dp_rank = l.mesh->get_local_rank("dp");
  l.dp_size = world_size() / tp;
  l.sharded = true;
  return l;
}

void layout_step(Layout& l, torch::optim::Optimizer& opt, int step) {
  torch::manual_seed(90 + step);
  const at::Tensor ids = torch::randint(0, 61, {4, 9});
  const int64_t rows = 4 / l.dp_size;
  const at::Tensor mine = ids.narrow(0, rows * l.dp_rank, rows);
  const at::Tensor logits =
      l.sharded ? tdist::fsdp::forward(l.model, mine) : l.model->forward(mine);
  models::causal_lm_loss(logits, mine).backward();
  opt.step();
  opt.zero_grad();
}

TDIST_SCENARIO(tensor_parallel_checkpoint) {
  const models::ModelConfig config = models::ModelConfig::from_json(config_json("qwen2"));
  const std::string layout = env_str("LAYOUT"), dir = env_str("CKPT_DIR");
  tdist::init_process_group();
  Layout l = make_layout(layout == "save" ? "dp2tp2" : layout, config);
  torch::optim::AdamW opt(l.model->parameters(), torch::optim::AdamWOptions(1e-2));
  if (layout == "save") {
    layout_step(l, opt, 0);
    auto options = tdist::checkpoint::SaveOptions().fsync(false);
    if (env_str("CKPT_FORMAT") == "dcp") options.format(tdist::checkpoint::CheckpointFormat::kDCP);
    tdist::checkpoint::save_module(*l.model, &opt, {}, dir, options);
    tdist::destroy_process_group();
    return;
  }
  tdist::checkpoint::load_module(*l.model, &opt, dir);
  layout_step(l, opt, 1);
  // The single process's two steps, on every rank.
  Layout ref;
  ref.model = build(config);
  torch::optim::AdamW ref_opt(ref.model->parameters(), torch::optim::AdamWOptions(1e-2));
  layout_step(ref, ref_opt, 0);
  layout_step(ref, ref_opt, 1);
  expect_parameters_equal(*l.model, *ref.model, l.sharded, "loaded at " + layout);
  tdist::destroy_process_group();
}

TDIST_SCENARIO(tensor_parallel_errors) {
  tdist::mesh::DeviceMesh mesh = tdist::mesh::init_device_mesh("cpu", {world_size()});
  auto llama = build(models::ModelConfig::from_json(config_json("llama")));  // 3 KV heads
  expect_invalid_argument([&] { models::apply_tensor_parallel(llama, mesh); }, "whole heads");
  tdist::destroy_process_group();
}

// The model transformers made, under tdist's tensor parallelism, five AdamW steps on the
// oracle's inputs: the losses of PyTorch's tensor parallelism on the same model and mesh,
// with the same plan (SP=1: sequence parallelism and loss_parallel on both sides).
TDIST_SCENARIO(tensor_parallel_like_pytorch) {
  const std::string dir = env_str("MODEL_DIR");
  const bool sp = env_str("SP") != "0";
  tdist::mesh::DeviceMesh mesh = tdist::mesh::init_device_mesh("cpu", {world_size()});
  auto model = models::from_pretrained(dir);
  model->train();
  models::apply_tensor_parallel(model, mesh, options_from_env());
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const at::Tensor ids = tensor_from(dir + "/inputs.safetensors", "input_ids");
  const at::Tensor expected = tensor_from(
      dir + "/tp_steps_" + std::to_string(world_size()) + (sp ? "_sp" : "") + ".safetensors",
      "losses");
  ASSERT_EQ(expected.numel(), 5);
  const at::Tensor targets = tdist::models::next_token_targets(ids);
  for (int step = 0; step < 5; ++step) {
    const at::Tensor loss = model->next_token_loss(ids, targets);
    loss.backward();
    opt.step();
    opt.zero_grad();
    const double want = expected[step].item<double>();
    EXPECT_NEAR(loss.item<double>(), want, 1e-5 * std::abs(want)) << "step " << step;
  }
  tdist::destroy_process_group();
}

// On the GPU (tools/gpu-check.sh): the sequence-parallel plan with loss parallelism moves its
// DTensors between CUDA tensors (world 1; world 2 shares the GPU over Gloo) and computes the
// loss, gradients and logits the plain model does there.
TDIST_SCENARIO(tensor_parallel_cuda) {
  const models::ModelConfig config = models::ModelConfig::from_json(config_json("qwen2"));
  tdist::mesh::DeviceMesh mesh = tdist::mesh::init_device_mesh("cuda", {world_size()});
  auto ref = build(config), model = build(config);
  ref->to(torch::kCUDA);
  model->to(torch::kCUDA);
  models::apply_tensor_parallel(model, mesh);
  const at::Tensor ids = torch::tensor({{3, 17, 60, 5, 9, 0, 41}, {8, 8, 2, 33, 59, 1, 12}}).cuda();
  const at::Tensor targets =
      torch::tensor({{17, 60, 5, 9, 0, 41, -100}, {8, 2, 33, 59, 1, 12, 4}}).cuda();
  const at::Tensor ref_loss = ref->next_token_loss(ids, targets);
  const at::Tensor loss = model->next_token_loss(ids, targets);
  EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-9);
  ref_loss.backward();
  loss.backward();
  const int64_t k = world_size(), r = tdist::get_rank();
  for (const std::string name : {"lm_head.weight", "model.layers.0.self_attn.q_proj.weight"}) {
    expect_close(grad_of(*model, name).cpu(), chunk_piece(grad_of(*ref, name).cpu(), 0, k, r),
                 name);
  }
  expect_close(grad_of(*model, "model.norm.weight").cpu(), grad_of(*ref, "model.norm.weight").cpu(),
               "norm (replicated)");
  torch::NoGradGuard no_grad;
  expect_close(model->forward(ids).cpu(), ref->forward(ids).cpu(), "logits");
  tdist::destroy_process_group();
}

void run(const std::string& scenario, int world, const std::string& family = "llama",
         const std::string& model_dir = "", bool sequence_parallel = true) {
  ProcessOptions options;
  options.timeout = std::chrono::seconds(180);
  options.env = {
      {"FAMILY", family}, {"MODEL_DIR", model_dir}, {"SP", sequence_parallel ? "1" : "0"}};
  expect_all_ok(run_ranks_as_processes(scenario, world, options));
}

TEST(TensorParallelModels, LlamaLogitsAndGradientsMatchOneProcess) {
  run("tensor_parallel_logits", 1, "llama");
  run("tensor_parallel_logits", 3, "llama");
  run("tensor_parallel_logits", 3, "llama", "", /*sequence_parallel=*/false);
}
TEST(TensorParallelModels, Qwen2WithBiasesMatchesOneProcess) {
  run("tensor_parallel_logits", 2, "qwen2");
  run("tensor_parallel_logits", 2, "qwen2", "", /*sequence_parallel=*/false);
}
TEST(TensorParallelModels, LossParallelEqualsCrossEntropyOfWholeLogits) {
  run("tensor_parallel_loss", 3, "llama");
  run("tensor_parallel_loss", 2, "qwen2", "", /*sequence_parallel=*/false);
}
TEST(TensorParallelModels, SequenceParallelGenerationMatchesOneProcess) {
  run("tensor_parallel_generation", 3, "llama");
}
TEST(TensorParallelModels, FSDPOverTensorParallelTrainsAsOneProcess) {
  run("two_d_llama", 4);
  run("two_d_llama", 3);
  run("two_d_llama", 4, "qwen2", "", /*sequence_parallel=*/false);
}
TEST(TensorParallelModels, LossesEqualPyTorchTensorParallelism) {
  const std::string why = transformers_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string dir = oracle_model("llama_tp");
  // World 2 with torchtitan's plain plan, world 4 with its sequence-parallel plan.
  run_oracle({"tp_steps", dir, "2", "5"});
  run("tensor_parallel_like_pytorch", 2, "llama", dir, /*sequence_parallel=*/false);
  run_oracle({"tp_steps", dir, "4", "5", "sp"});
  run("tensor_parallel_like_pytorch", 4, "llama", dir);
}
TEST(TensorParallelModels, ACheckpointSavedAtDp2Tp2LoadsAtEveryLayout) {
  for (const std::string format : {"tdist", "dcp"}) {
    SCOPED_TRACE(format + " format");
    const std::string dir = make_temp_dir("tp-ckpt") + "/ckpt";
    ProcessOptions options;
    options.timeout = std::chrono::seconds(180);
    options.env = {{"LAYOUT", "save"}, {"CKPT_DIR", dir}, {"CKPT_FORMAT", format}};
    expect_all_ok(run_ranks_as_processes("tensor_parallel_checkpoint", 4, options));
    for (const auto& [layout, world] :
         std::vector<std::pair<std::string, int>>{{"dp4", 4}, {"tp2", 2}, {"single", 1}}) {
      options.env = {{"LAYOUT", layout}, {"CKPT_DIR", dir}};
      expect_all_ok(run_ranks_as_processes("tensor_parallel_checkpoint", world, options));
    }
  }
}
TEST(ModelsOnCuda, TensorParallelPlanComputesWhatThePlainModelDoes) {
  if (!tdist::testing::has_gpu()) GTEST_SKIP() << "no GPU: LibTorch sees no CUDA device";
  run("tensor_parallel_cuda", 1, "qwen2");
  run("tensor_parallel_cuda", 2, "qwen2");
}
TEST(TensorParallelModels, RefusesHeadsTheMeshDoesNotDivide) {
  run("tensor_parallel_errors", 2);
}

}  // namespace

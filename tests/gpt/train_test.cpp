// End-to-end training of tiny models of the families: the loss drops at world sizes 1-3,
// larger worlds match world 1 step for step, the run dir holds every output, a resumed run
// (at the same or another world size) continues with the losses of an uninterrupted one,
// fine-tuning a folder transformers made hands back a folder transformers loads, and
// transformers' greedy continuation of every export format equals `gpt generate`'s.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "gpt/checkpointing.h"
#include "gpt/export.h"
#include "gpt/generate.h"
#include "gpt/metrics.h"
#include "gpt/trainer.h"
#include "oracle.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/models/tokenizer.h"

namespace fs = std::filesystem;

namespace {

using tdist::testing::expect_invalid_argument;

gpt::TrainConfig tiny_config(const std::string& run_dir) {
  gpt::TrainConfig c;
  c.model.block_size = 32;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.steps = 30;
  c.batch_size = 8;
  c.schedule.max_lr = 1e-2;
  c.schedule.min_lr = 1e-3;
  c.schedule.warmup_steps = 3;
  c.eval_interval = 15;
  c.eval_batches = 4;
  c.nproc = 1;
  c.threads = 1;
  c.run_dir = run_dir;
  c.checkpoint_interval = 0;
  c.quiet = true;
  c.sample.max_new_tokens = 24;
  // Tokenized once for every test of this process (the cache is named by its contents).
  c.token_cache = std::string(::testing::TempDir()) + "/gpt-test-tokens";
  return c;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs examples/gpt/python/`script` with `args`; its stdout, or a test failure.
std::string run_python(const std::string& script, const std::string& args) {
  const std::string dir = tdist::testing::make_temp_dir("gpt-py");
  const std::string cmd = tdist::testing::test_python() + " " + TDIST_GPT_PYTHON_DIR + "/" +
                          script + " " + args + " >" + dir + "/out.txt 2>" + dir + "/err.txt";
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd << "\n" << read_text(dir + "/err.txt");
  return read_text(dir + "/out.txt");
}

tdist::models::Tokenizer run_tokenizer(const std::string& run_dir) {
  return tdist::models::Tokenizer::from_file(gpt::model_files_dir(run_dir) + "/tokenizer.json");
}

std::vector<double> logged(const std::string& run_dir, const std::string& kind) {
  std::vector<double> values;
  for (const auto& r : gpt::read_metrics(run_dir + "/metrics.jsonl")) {
    if (r["kind"] == kind) values.push_back(r["loss"].get<double>());
  }
  return values;
}

TEST(GptTrain, TinyConfigLossDropsAtWorldOne) {
  const auto dir = tdist::testing::make_temp_dir("gpt-train");
  auto config = tiny_config(dir);
  std::ostringstream out;
  auto result = gpt::train(config, gpt::World{}, out);
  EXPECT_EQ(result.mode, "single");
  ASSERT_EQ(result.train_loss.size(), 30u);
  ASSERT_GE(result.val_loss.size(), 2u);
  EXPECT_EQ(result.val_loss.front().first, 0);
  EXPECT_EQ(result.val_loss.back().first, 30);
  EXPECT_LT(result.val_loss.back().second, result.val_loss.front().second - 1.0);
  EXPECT_LT(result.train_loss.back(), result.train_loss.front() - 1.0);
  EXPECT_FALSE(result.sample.empty());
  // Every output is there and consistent with the result.
  EXPECT_EQ(logged(dir, "train").size(), 30u);
  EXPECT_DOUBLE_EQ(logged(dir, "train").back(), result.train_loss.back());
  EXPECT_TRUE(fs::exists(dir + "/loss.svg"));
  EXPECT_TRUE(fs::exists(dir + "/trace_rank0.json"));
  EXPECT_TRUE(fs::exists(dir + "/config.json"));
  EXPECT_TRUE(fs::exists(dir + "/model/config.json"));
  EXPECT_TRUE(fs::exists(dir + "/model/tokenizer.json"));
  std::ifstream trace(dir + "/trace_rank0.json");
  auto json = nlohmann::json::parse(trace);
  int forward = 0, backward = 0, optimizer = 0;
  for (const auto& e : json["traceEvents"]) {
    forward += e["name"] == "forward";
    backward += e["name"] == "backward";
    optimizer += e["name"] == "optimizer";
  }
  EXPECT_EQ(forward, 30);
  EXPECT_EQ(backward, 30);
  EXPECT_EQ(optimizer, 30);
}

// --mixed-precision bf16 (autocast): the loss still drops like fp32's and stays close to it
// (bf16 keeps 8 significant bits: a 30-step run on this tiny model ends within 5% of fp32).
TEST(GptTrain, MixedPrecisionBf16TrainsCloseToFp32) {
  auto fp32_config = tiny_config(tdist::testing::make_temp_dir("gpt-fp32"));
  auto bf16_config = tiny_config(tdist::testing::make_temp_dir("gpt-bf16"));
  bf16_config.mixed_precision = "bf16";
  std::ostringstream out;
  auto fp32 = gpt::train(fp32_config, gpt::World{}, out);
  auto bf16 = gpt::train(bf16_config, gpt::World{}, out);
  ASSERT_EQ(bf16.train_loss.size(), 30u);
  EXPECT_LT(bf16.train_loss.back(), bf16.train_loss.front() - 1.0);
  EXPECT_NE(bf16.train_loss.back(), fp32.train_loss.back());  // bf16 really ran
  EXPECT_NEAR(bf16.train_loss.back(), fp32.train_loss.back(), 0.05 * fp32.train_loss.back());
}

TEST(GptTrain, GradientAccumulationMatchesALargerBatch) {
  // grad_accum 2 x batch 4 draws the same 8 windows per step as batch 8, and averages
  // the micro-step gradients: the losses agree step by step.
  std::vector<double> losses[2];
  for (int i = 0; i < 2; ++i) {
    auto config = tiny_config(tdist::testing::make_temp_dir("gpt-accum"));
    config.steps = 6;
    config.batch_size = i == 0 ? 8 : 4;
    config.grad_accum = i == 0 ? 1 : 2;
    config.sample.max_new_tokens = 0;
    std::ostringstream out;
    losses[i] = gpt::train(config, gpt::World{}, out).train_loss;
  }
  ASSERT_EQ(losses[0].size(), 6u);
  ASSERT_EQ(losses[1].size(), 6u);
  EXPECT_NEAR(losses[0][0], std::log(2048.0), 0.3);  // averaged, not summed (vocab 2048)
  for (size_t s = 0; s < 6; ++s) EXPECT_NEAR(losses[0][s], losses[1][s], 1e-3) << "step " << s + 1;
}

// --cpu-offload at one rank: FSDP over a group of one with the shards on the host, which
// trains like the single process (the same math, other buffers).
TEST(GptTrain, CpuOffloadAtWorldOneShardsAndTrainsLikeSingle) {
  auto single_config = tiny_config(tdist::testing::make_temp_dir("gpt-single"));
  auto offload_config = tiny_config(tdist::testing::make_temp_dir("gpt-offload"));
  single_config.steps = offload_config.steps = 10;
  single_config.sample.max_new_tokens = offload_config.sample.max_new_tokens = 0;
  offload_config.cpu_offload = true;
  offload_config.checkpoint_interval = 10;
  std::ostringstream out;
  const auto single = gpt::train(single_config, gpt::World{}, out);
  const auto offload = gpt::train(offload_config, gpt::World{}, out);
  EXPECT_EQ(offload.mode, "fsdp");
  ASSERT_EQ(offload.train_loss.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_NEAR(offload.train_loss[i], single.train_loss[i], 1e-5) << "step " << i + 1;
  }
  EXPECT_TRUE(gpt::newest_checkpoint(offload_config.run_dir).has_value());
}

// --device cuda at world 1: the loss drops as on the CPU and stays close to the CPU run's
// (other kernels, same math); a checkpoint written from the GPU resumes on the CPU and the
// CPU's generate reads it.
TEST(GptTrain, CudaTrainsLikeCpuAndItsCheckpointsResumeOnCpu) {
  if (!tdist::testing::has_gpu()) GTEST_SKIP() << "needs a CUDA GPU; none here";
  auto cpu_config = tiny_config(tdist::testing::make_temp_dir("gpt-cpu"));
  auto cuda_config = tiny_config(tdist::testing::make_temp_dir("gpt-cuda"));
  cuda_config.checkpoint_interval = 15;
  gpt::World on_gpu;
  on_gpu.device = c10::Device(c10::kCUDA, 0);
  std::ostringstream out;
  const auto cpu = gpt::train(cpu_config, gpt::World{}, out);
  const auto cuda = gpt::train(cuda_config, on_gpu, out);
  ASSERT_EQ(cuda.train_loss.size(), 30u);
  EXPECT_LT(cuda.train_loss.back(), cuda.train_loss.front() - 1.0);
  EXPECT_NEAR(cuda.train_loss.back(), cpu.train_loss.back(), 1e-3 * cpu.train_loss.back());
  EXPECT_FALSE(cuda.sample.empty());

  auto resumed = cuda_config;
  resumed.steps = 40;
  resumed.resume = true;
  const auto on_cpu = gpt::train(resumed, gpt::World{}, out);
  EXPECT_EQ(on_cpu.start_step, 30);
  ASSERT_EQ(on_cpu.train_loss.size(), 10u);
  EXPECT_LT(on_cpu.train_loss.back(), cuda.train_loss.front());
  auto model = gpt::load_model_from_run(cuda_config.run_dir);
  EXPECT_TRUE(model->parameters().front().device().is_cpu());
}

void expect_resume_continues_with_the_same_loss(bool async) {
  const auto full_dir = tdist::testing::make_temp_dir("gpt-resume-full");
  auto full = tiny_config(full_dir);
  full.steps = 10;
  full.checkpoint_interval = 5;
  full.sample.max_new_tokens = 0;
  full.async_checkpoint = async;
  std::ostringstream out;
  auto uninterrupted = gpt::train(full, gpt::World{}, out);
  ASSERT_EQ(uninterrupted.train_loss.size(), 10u);

  // An "interrupted" run: only the step-5 checkpoint exists.
  const auto resumed_dir = tdist::testing::make_temp_dir("gpt-resume-cut");
  std::string step5;
  for (const auto& entry : fs::directory_iterator(full_dir + "/checkpoints")) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, std::regex("step_0*5"))) step5 = entry.path().string();
  }
  ASSERT_FALSE(step5.empty()) << "no step-5 checkpoint in " << full_dir << "/checkpoints";
  fs::create_directories(resumed_dir + "/checkpoints");
  fs::copy(step5, resumed_dir + "/checkpoints/" + fs::path(step5).filename().string(),
           fs::copy_options::recursive);

  auto cut = full;
  cut.run_dir = resumed_dir;
  cut.resume = true;
  auto resumed = gpt::train(cut, gpt::World{}, out);
  EXPECT_EQ(resumed.start_step, 5);
  ASSERT_EQ(resumed.train_loss.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(resumed.train_loss[i], uninterrupted.train_loss[5 + i], 1e-6) << "step " << 6 + i;
  }
  ASSERT_TRUE(gpt::newest_checkpoint(resumed_dir).has_value());
}

// With --async-checkpoint the step-5 checkpoint is written while steps 6-10 change the
// model in place: it must hold the state of step 5 all the same.
TEST(GptTrain, ResumeContinuesWithTheSameLoss) {
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async checkpoint" : "sync checkpoint");
    expect_resume_continues_with_the_same_loss(async);
  }
}

TEST(GptTrain, GenerateReadsTheNewestCheckpoint) {
  const auto full_dir = tdist::testing::make_temp_dir("gpt-generate");
  auto full = tiny_config(full_dir);
  full.steps = 5;
  full.checkpoint_interval = 5;
  full.sample.max_new_tokens = 0;
  std::ostringstream out;
  gpt::train(full, gpt::World{}, out);
  // generate reads the newest checkpoint of a run, deterministically for a seed.
  auto model = gpt::load_model_from_run(full_dir);
  const auto tokenizer = run_tokenizer(full_dir);
  gpt::SampleOptions sample;
  sample.max_new_tokens = 16;
  const auto text = gpt::generate_text(*model, tokenizer, "And", sample);
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(gpt::generate_text(*model, tokenizer, "And", sample), text);
  sample.seed += 1;
  EXPECT_NE(gpt::generate_text(*model, tokenizer, "And", sample), text);
}

TEST(GptTrain, BadInputsAreNamed) {
  const auto dir = tdist::testing::make_temp_dir("gpt-bad");
  std::ostringstream out;
  auto config = tiny_config(dir + "/run");
  config.steps = 1;
  config.schedule.warmup_steps = 0;
  // A token file that is not one.
  config.data_path = dir + "/odd.bin";
  std::ofstream(config.data_path, std::ios::binary) << std::string("\x01\x00\x02", 3);
  expect_invalid_argument([&] { gpt::train(config, gpt::World{}, out); }, "odd.bin");
  // --from a folder that holds no model.
  config.data_path.clear();
  config.model.from = dir;
  expect_invalid_argument([&] { gpt::train(config, gpt::World{}, out); }, "not a model folder");
  // A model shorter than --block-size.
  config.model.from.clear();
  auto short_model = config.model.to_hf_json(2048, 0, 1);
  short_model["max_position_embeddings"] = 16;
  config.model.config_file = dir + "/short.json";
  std::ofstream(config.model.config_file) << short_model.dump();
  expect_invalid_argument([&] { gpt::train(config, gpt::World{}, out); },
                          "max_position_embeddings");
  // A tokenizer with more tokens than the model's vocabulary.
  auto small_vocab = config.model.to_hf_json(100, 0, 1);
  config.model.config_file = dir + "/small.json";
  std::ofstream(config.model.config_file) << small_vocab.dump();
  expect_invalid_argument([&] { gpt::train(config, gpt::World{}, out); },
                          "more than the model's vocab_size");
  // Tensor parallelism over more ranks than there are, or outside FSDP.
  config.model.config_file.clear();
  config.tp = 2;
  expect_invalid_argument([&] { gpt::train(config, gpt::World{}, out); },
                          "--tp 2 needs --mode fsdp");
}

#ifdef TDIST_GPT_WITH_CHECKPOINT
// `gpt export` hands a run to Python: transformers loads each format (a Hugging Face folder,
// or pt / safetensors / a torch.distributed.checkpoint directory with the config beside it,
// examples/gpt/python/hf_generate.py) and, greedy, continues a prompt with exactly the text
// `gpt generate --temperature 0` gives.
TEST(GptExport, TransformersLoadsEveryFormatAndGeneratesWhatTdistGenerates) {
  if (!tdist::testing::transformers_unavailable().empty()) {
    GTEST_SKIP() << tdist::testing::transformers_unavailable();
  }
  const auto dir = tdist::testing::make_temp_dir("gpt-export");
  auto config = tiny_config(dir);
  config.model.n_head = 4;
  config.model.n_kv_head = 2;
  config.model.max_positions = 64;  // room for the prompt and 30 new tokens
  config.steps = 6;
  config.checkpoint_interval = 3;
  config.sample.max_new_tokens = 0;
  std::ostringstream out;
  gpt::train(config, gpt::World{}, out);
  gpt::SampleOptions greedy;
  greedy.temperature = 0.0;
  greedy.max_new_tokens = 30;
  auto model = gpt::load_model_from_run(dir);
  const std::string want =
      "And God" + gpt::generate_text(*model, run_tokenizer(dir), "And God", greedy) + "\n";
  // An older step is another model (it was trained less).
  auto step3 = gpt::load_model_from_run(dir, 3);
  EXPECT_FALSE(step3->parameters().front().equal(model->parameters().front()));
  for (const std::string format : {"hf", "pt", "safetensors", "dcp"}) {
    SCOPED_TRACE(format);
    gpt::ExportConfig x;
    x.run_dir = dir;
    x.format = format;
    x.out = format == "hf" ? dir + "/export/hf" : dir + "/export/model." + format;
    const auto files = gpt::export_run(x);
    EXPECT_FALSE(files.empty());
    std::string args = "'" + x.out + "' --prompt 'And God' --max-new-tokens 30 --threads 1";
    if (format == "hf") {
      EXPECT_TRUE(fs::exists(x.out + "/config.json"));
      EXPECT_TRUE(fs::exists(x.out + "/tokenizer.json"));
      EXPECT_TRUE(fs::exists(x.out + "/generation_config.json"));
    } else {
      EXPECT_TRUE(fs::exists(dir + "/export/model.json"));
      args += " --tokenizer '" + gpt::model_files_dir(dir) + "'";
    }
    EXPECT_EQ(run_python("hf_generate.py", args), want);
  }
  gpt::ExportConfig bad;
  bad.run_dir = dir;
  bad.out = dir + "/export/bad.pt";
  bad.format = "pt";
  bad.step = 4;
  try {
    gpt::export_run(bad);
    ADD_FAILURE() << "exported a step that has no checkpoint";
  } catch (const tdist::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("no complete checkpoint of step 4"), std::string::npos)
        << e.what();
  }
}
#endif

#ifdef TDIST_GPT_WITH_COMM

// Run by each rank process: trains the tiny config described by the environment.
TDIST_SCENARIO(gpt_train_tiny) {
  auto config = tiny_config(std::getenv("GPT_TEST_RUN_DIR"));
  config.mode = gpt::parse_parallel_mode(std::getenv("GPT_TEST_MODE"));
  config.steps = std::atoi(std::getenv("GPT_TEST_STEPS"));
  config.batch_size = std::atoi(std::getenv("GPT_TEST_BATCH"));
  config.eval_interval = 0;
  config.sample.max_new_tokens = 8;
  config.model.from = tdist::testing::env_str("GPT_TEST_FROM", "");
  if (!config.model.from.empty()) config.tokenizer_path = gpt::default_tokenizer_path();
  config.checkpoint_interval = tdist::testing::env_int("GPT_TEST_CHECKPOINT_INTERVAL", 0);
  config.resume = tdist::testing::env_int("GPT_TEST_RESUME", 0) != 0;
  config.tp = tdist::testing::env_int("GPT_TEST_TP", 1);
  if (const char* lr = std::getenv("GPT_TEST_LR")) {
    config.schedule.max_lr = std::atof(lr);
    config.schedule.min_lr = config.schedule.max_lr / 10;
  }
  auto world = gpt::init_world(60);
  std::ostringstream out;
  auto result = gpt::train(config, world, out);
  gpt::shutdown_world(world);
  if (result.train_loss.size() != static_cast<size_t>(config.steps - result.start_step)) {
    std::exit(3);
  }
}

std::string train_in_processes(int world_size, const std::string& mode, int steps, int batch,
                               std::map<std::string, std::string> extra_env = {},
                               std::string dir = "") {
  if (dir.empty()) dir = tdist::testing::make_temp_dir("gpt-world" + std::to_string(world_size));
  tdist::testing::ProcessOptions options;
  options.env = {{"GPT_TEST_RUN_DIR", dir},
                 {"GPT_TEST_MODE", mode},
                 {"GPT_TEST_STEPS", std::to_string(steps)},
                 {"GPT_TEST_BATCH", std::to_string(batch)}};
  for (auto& [k, v] : extra_env) options.env[k] = v;
  options.timeout = std::chrono::seconds(240);
  auto results = tdist::testing::run_ranks_as_processes("gpt_train_tiny", world_size, options);
  tdist::testing::expect_all_ok(results);
  return dir;
}

TEST(GptTrain, TinyConfigLossDropsAtWorldTwo) {
  const auto dir = train_in_processes(2, "ddp", 30, 8);
  auto val = logged(dir, "val");
  ASSERT_GE(val.size(), 2u);
  EXPECT_LT(val.back(), val.front() - 1.0);
  EXPECT_TRUE(fs::exists(dir + "/trace_rank0.json"));
  EXPECT_TRUE(fs::exists(dir + "/trace_rank1.json"));
  EXPECT_TRUE(fs::exists(dir + "/loss.svg"));
}

TEST(GptTrain, DdpAtWorldTwoMatchesWorldOneWithTheSameGlobalBatch) {
  // Rank r of world 2 (batch B) takes rows r, r+2, ... of world 1's batch 2B, and the
  // averaged gradient equals the world-1 gradient: the losses must agree step by step.
  const auto one = train_in_processes(1, "single", 8, 8);
  const auto two = train_in_processes(2, "ddp", 8, 4);
  auto a = logged(one, "train"), b = logged(two, "train");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-3) << "step " << i + 1;
}

TEST(GptTrain, StartedBySrunWithNoFlagsTrainsAsUnderTdistrun) {
  // Only srun's variables (no RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): the trainer takes
  // its rank, world and store from them (Note [Launch environment precedence]) and trains
  // step for step as the same job started the torchrun way.
  const auto tdistrun_way = train_in_processes(2, "ddp", 4, 4);
  const std::string dir = tdist::testing::make_temp_dir("gpt-srun");
  tdist::testing::ProcessOptions options;
  options.bare_env = true;
  options.env = tdist::testing::srun_environment(2, tdist::testing::slurm_job_id_with_free_port());
  for (const auto& [k, v] : std::map<std::string, std::string>{{"GPT_TEST_RUN_DIR", dir},
                                                               {"GPT_TEST_MODE", "ddp"},
                                                               {"GPT_TEST_STEPS", "4"},
                                                               {"GPT_TEST_BATCH", "4"}}) {
    options.env[k] = v;
  }
  for (int r = 0; r < 2; ++r) options.rank_env[r] = tdist::testing::srun_task_environment(r);
  options.timeout = std::chrono::seconds(240);
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("gpt_train_tiny", 2, options));
  auto a = logged(tdistrun_way, "train"), b = logged(dir, "train");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

#ifdef TDIST_GPT_WITH_FSDP
TEST(GptTrain, FsdpAtWorldThreeMatchesWorldOneWithTheSameGlobalBatch) {
  // Pretraining builds the model on the meta device and each rank materialises its shards
  // from per-module seeds: the initial weights do not depend on the world size, so world 3's
  // FSDP run follows world 1's step for step.
  const auto one = train_in_processes(1, "single", 6, 6);
  const auto three = train_in_processes(3, "fsdp", 6, 2);
  auto a = logged(one, "train"), b = logged(three, "train");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-3) << "step " << i + 1;
  EXPECT_LT(b.back(), b.front()) << "and they train";
}

#ifdef TDIST_GPT_WITH_CHECKPOINT
TEST(GptTrain, HsdpAtWorldFourMatchesWorldOneAndItsCheckpointLoads) {
  // Two replicas, each sharding over 2 ranks: the same global batch and per-module-seeded
  // weights as world 1, so the same losses; the replicas' identical shards are written once.
  const auto one = train_in_processes(1, "single", 5, 8);
  const auto hsdp = train_in_processes(4, "hsdp", 5, 2, {{"GPT_TEST_CHECKPOINT_INTERVAL", "5"}});
  auto a = logged(one, "train"), b = logged(hsdp, "train");
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-3) << "step " << i + 1;
  auto model = gpt::load_model_from_run(hsdp);
  EXPECT_GT(model->parameters().size(), 0u);
  std::ostringstream out;
  auto three = tiny_config(hsdp);
  three.mode = gpt::ParallelMode::kHSDP;
  gpt::World world;  // one rank: hsdp has nothing to replicate
  expect_invalid_argument([&] { gpt::train(three, world, out); },
                          "--mode hsdp needs several ranks");
}

// Keeps only `step`'s checkpoint of `from` in a new run dir (a run cut off after it).
std::string cut_after(const std::string& from, int64_t step) {
  const auto ckpt = gpt::checkpoint_at_step(from, step);
  EXPECT_TRUE(ckpt.has_value()) << "no step " << step << " checkpoint in " << from;
  const auto dir = tdist::testing::make_temp_dir("gpt-cut");
  fs::create_directories(dir + "/checkpoints");
  if (ckpt) {
    fs::copy(*ckpt, dir + "/checkpoints/" + fs::path(*ckpt).filename().string(),
             fs::copy_options::recursive);
  }
  return dir;
}

TEST(GptTrain, ResumedAtAnotherWorldSizeSeesTheBatchesAnUninterruptedRunWould) {
  // 8 FSDP steps at world 2 (batch 3, 6 sequences a step); cut after step 4, resumed at
  // world 3 (batch 2) and at world 2: the loader's position comes back with the weights, so
  // steps 5-8 read the same sequences and give the same losses.
  const std::map<std::string, std::string> every4 = {{"GPT_TEST_CHECKPOINT_INTERVAL", "4"}};
  const auto full = train_in_processes(2, "fsdp", 8, 3, every4);
  auto want = logged(full, "train");
  ASSERT_EQ(want.size(), 8u);
  for (int world : {3, 2}) {
    SCOPED_TRACE("resumed at world " + std::to_string(world));
    const auto cut = cut_after(full, 4);
    train_in_processes(world, "fsdp", 8, 6 / world, {{"GPT_TEST_RESUME", "1"}}, cut);
    auto got = logged(cut, "train");
    ASSERT_EQ(got.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[4 + i], 2e-3) << "step " << 5 + i;
  }
}

TEST(GptTrain, TensorParallelAtWorldFourFollowsFsdpAtWorldTwoAndResumesWithoutIt) {
  // --tp 2 at world 4 is FSDP over 2 model replicas, each tensor-parallel over 2 ranks: the
  // batches and the initial weights of FSDP at world 2, so the same losses. Its checkpoint
  // holds each parameter's slice in whole-tensor coordinates, so it resumes at world 2
  // without tensor parallelism and continues as the uninterrupted run.
  const auto fsdp = train_in_processes(2, "fsdp", 8, 3);
  const auto tp = train_in_processes(4, "fsdp", 8, 3,
                                     {{"GPT_TEST_TP", "2"}, {"GPT_TEST_CHECKPOINT_INTERVAL", "4"}});
  auto want = logged(fsdp, "train"), got = logged(tp, "train");
  ASSERT_EQ(want.size(), 8u);
  ASSERT_EQ(got.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(got[i], want[i], 2e-3) << "step " << i + 1;
  const auto cut = cut_after(tp, 4);
  train_in_processes(2, "fsdp", 8, 3, {{"GPT_TEST_RESUME", "1"}}, cut);
  auto resumed = logged(cut, "train");
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(resumed[i], want[4 + i], 2e-3) << "step " << 5 + i;
}

// Exports `run_dir` in HF format and has transformers reload it: every parameter bitwise as
// tdist holds it, equal logits on the oracle's inputs, and each parameter moved from `base`'s
// by at most about the learning rate a step (training started from the folder's weights).
void expect_transformers_reloads_the_export(const std::string& run_dir, const std::string& base) {
  gpt::ExportConfig x;
  x.run_dir = run_dir;
  x.out = run_dir + "/hf";
  gpt::export_run(x);
  fs::copy_file(base + "/inputs.safetensors", x.out + "/inputs.safetensors");
  auto model = gpt::load_model_from_run(run_dir);
  model->eval();
  torch::NoGradGuard no_grad;
  tdist::checkpoint::TensorMap ref = tdist::checkpoint::module_tensors(*model);
  ref["logits"] =
      model->forward(tdist::testing::tensor_from(base + "/inputs.safetensors", "input_ids"))
          .contiguous();
  tdist::checkpoint::save_safetensors(ref, run_dir + "/ref.safetensors");
  const std::string checked =
      tdist::testing::run_oracle({"check_export", x.out, run_dir + "/ref.safetensors"});
  EXPECT_NE(checked.find("parameters bitwise"), std::string::npos) << checked;
  tdist::testing::run_oracle({"moved", base, x.out, "0.01"});
}

// Fine-tuning a folder transformers made: three FSDP steps at world 3 from its weights, then
// `gpt export`: transformers reloads every parameter bitwise as tdist holds it (with equal
// logits), and each moved by at most a few learning rates from the original (so training
// started from the folder's weights, not from a fresh init).
TEST(GptTrain, FinetuneAtWorldThreeHandsTransformersItsModelBack) {
  if (!tdist::testing::transformers_unavailable().empty()) {
    GTEST_SKIP() << tdist::testing::transformers_unavailable();
  }
  const std::string base = tdist::testing::oracle_model("trainer_llama");
  const auto dir = train_in_processes(
      3, "fsdp", 3, 2,
      {{"GPT_TEST_FROM", base}, {"GPT_TEST_LR", "1e-3"}, {"GPT_TEST_CHECKPOINT_INTERVAL", "3"}});
  auto losses = logged(dir, "train");
  ASSERT_EQ(losses.size(), 3u);
  expect_transformers_reloads_the_export(dir, base);
}

// Fine-tuning under HSDP (2 replicas x 2 shards) follows the single process on the same global
// batch step by step, and its export (the replicas' identical shards written once) is what
// transformers reloads.
TEST(GptTrain, FinetuneUnderHsdpAtWorldFourFollowsOneProcess) {
  if (!tdist::testing::transformers_unavailable().empty()) {
    GTEST_SKIP() << tdist::testing::transformers_unavailable();
  }
  const std::string base = tdist::testing::oracle_model("trainer_llama");
  const std::map<std::string, std::string> from = {
      {"GPT_TEST_FROM", base}, {"GPT_TEST_LR", "1e-3"}, {"GPT_TEST_CHECKPOINT_INTERVAL", "3"}};
  const auto one = train_in_processes(1, "single", 3, 4, from);
  const auto hsdp = train_in_processes(4, "hsdp", 3, 1, from);
  auto a = logged(one, "train"), b = logged(hsdp, "train");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-3) << "step " << i + 1;
  expect_transformers_reloads_the_export(hsdp, base);
}
#endif
#endif

#endif  // TDIST_GPT_WITH_COMM

}  // namespace

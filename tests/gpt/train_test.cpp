// End-to-end training of a tiny GPT: the loss drops at world sizes 1 and 2, world 2 matches
// world 1 step for step, the run dir holds every output, and a resumed run continues with
// the same losses as an uninterrupted one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "gpt/checkpointing.h"
#include "gpt/export.h"
#include "gpt/generate.h"
#include "gpt/metrics.h"
#include "gpt/trainer.h"
#include "support/expect.h"
#include "support/ranks.h"

namespace fs = std::filesystem;

namespace {

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
  return c;
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
  EXPECT_EQ(result.sample.size(), 24u);
  // Every output is there and consistent with the result.
  EXPECT_EQ(logged(dir, "train").size(), 30u);
  EXPECT_DOUBLE_EQ(logged(dir, "train").back(), result.train_loss.back());
  EXPECT_TRUE(fs::exists(dir + "/loss.svg"));
  EXPECT_TRUE(fs::exists(dir + "/trace_rank0.json"));
  EXPECT_TRUE(fs::exists(dir + "/config.json"));
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
  EXPECT_NEAR(losses[0][0], std::log(256.0), 0.3);  // averaged, not summed
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
  EXPECT_EQ(cuda.sample.size(), 24u);

  auto resumed = cuda_config;
  resumed.steps = 40;
  resumed.resume = true;
  const auto on_cpu = gpt::train(resumed, gpt::World{}, out);
  EXPECT_EQ(on_cpu.start_step, 30);
  ASSERT_EQ(on_cpu.train_loss.size(), 10u);
  EXPECT_LT(on_cpu.train_loss.back(), cuda.train_loss.front());
  auto model = gpt::load_model_from_run(cuda_config.run_dir);
  EXPECT_TRUE(model->wte->weight.device().is_cpu());
}

TEST(GptTrain, ResumeContinuesWithTheSameLoss) {
  const auto full_dir = tdist::testing::make_temp_dir("gpt-resume-full");
  auto full = tiny_config(full_dir);
  full.steps = 10;
  full.checkpoint_interval = 5;
  full.sample.max_new_tokens = 0;
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

  // generate reads the newest checkpoint of a run, deterministically.
  auto model = gpt::load_model_from_run(full_dir);
  gpt::SampleOptions sample;
  sample.max_new_tokens = 16;
  EXPECT_EQ(gpt::generate(model, "And", sample), gpt::generate(model, "And", sample));
}

#ifdef TDIST_GPT_WITH_CHECKPOINT
// `gpt export` hands a run to Python: the Python twin of the model
// (examples/gpt/python/gpt_export.py) loads each format (pt, safetensors, a
// torch.distributed.checkpoint directory) and, greedy, continues a prompt
// with exactly the text the C++ model gives.
TEST(GptExport, PythonLoadsEveryFormatAndGeneratesWhatCppGenerates) {
  const char* python = std::getenv("TDIST_TEST_PYTHON");
  if (python == nullptr ||
      std::system(
          (std::string(python) + " -c 'import torch, safetensors' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << "needs TDIST_TEST_PYTHON with torch and safetensors (tools/setup.sh)";
  }
  const auto dir = tdist::testing::make_temp_dir("gpt-export");
  auto config = tiny_config(dir);
  config.steps = 6;
  config.checkpoint_interval = 3;
  config.sample.max_new_tokens = 0;
  std::ostringstream out;
  gpt::train(config, gpt::World{}, out);
  gpt::SampleOptions greedy;
  greedy.top_k = 1;
  greedy.max_new_tokens = 40;
  auto model = gpt::load_model_from_run(dir);
  const std::string want = gpt::generate(model, "And God", greedy);
  ASSERT_EQ(want.size(), 40u);
  // An older step is another model (it was trained less).
  auto step3 = gpt::load_model_from_run(dir, 3);
  EXPECT_FALSE(step3->wte->weight.equal(model->wte->weight));
  for (const std::string format : {"pt", "safetensors", "dcp"}) {
    SCOPED_TRACE(format);
    gpt::ExportConfig x;
    x.run_dir = dir;
    x.format = format;
    x.out = dir + "/export/gpt." + format;
    const auto files = gpt::export_run(x);
    ASSERT_EQ(files.size(), 2u);
    EXPECT_TRUE(fs::exists(dir + "/export/gpt.json"));
    const std::string script = dir + "/run.py", log = dir + "/py.txt";
    std::ofstream(script) << "import sys\nsys.path.insert(0, '" << TDIST_GPT_PYTHON_DIR
                          << "')\nimport gpt_export\nm = gpt_export.load(sys.argv[1])\n"
                             "sys.stdout.write(gpt_export.generate(m, 'And God', 40))\n";
    const int rc = std::system(
        (std::string(python) + " " + script + " " + x.out + " >" + log + " 2>&1").c_str());
    std::ifstream in(log);
    const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_EQ(rc, 0) << got;
    EXPECT_EQ(got, want);
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
  config.deferred_init = tdist::testing::env_int("GPT_TEST_DEFERRED_INIT", 0) != 0;
  auto world = gpt::init_world(60);
  std::ostringstream out;
  auto result = gpt::train(config, world, out);
  gpt::shutdown_world(world);
  if (result.train_loss.size() != static_cast<size_t>(config.steps)) std::exit(3);
}

std::string train_in_processes(int world_size, const std::string& mode, int steps, int batch,
                               bool deferred_init = false) {
  const auto dir = tdist::testing::make_temp_dir("gpt-world" + std::to_string(world_size));
  tdist::testing::ProcessOptions options;
  options.env = {{"GPT_TEST_RUN_DIR", dir},
                 {"GPT_TEST_MODE", mode},
                 {"GPT_TEST_STEPS", std::to_string(steps)},
                 {"GPT_TEST_BATCH", std::to_string(batch)},
                 {"GPT_TEST_DEFERRED_INIT", deferred_init ? "1" : "0"}};
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

#ifdef TDIST_GPT_WITH_FSDP
TEST(GptTrain, DeferredInitFsdpAtWorldThreeMatchesWorldOneWithTheSameGlobalBatch) {
  // --deferred-init: built on the meta device, each rank materialising only its shards from
  // per-module seeds; the initial weights do not depend on the world size, so world 3's FSDP
  // run follows world 1's (the whole model, materialised without FSDP) step for step.
  const auto one = train_in_processes(1, "single", 6, 6, /*deferred_init=*/true);
  const auto three = train_in_processes(3, "fsdp", 6, 2, /*deferred_init=*/true);
  const auto eager = train_in_processes(1, "single", 6, 6);
  auto a = logged(one, "train"), b = logged(three, "train"), e = logged(eager, "train");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  ASSERT_EQ(e.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-3) << "step " << i + 1;
  EXPECT_NE(a[0], e[0]) << "deferred init's weights are its own (per-module seeds)";
  EXPECT_LT(b.back(), b.front()) << "and they train";
}
#endif

#endif  // TDIST_GPT_WITH_COMM

}  // namespace

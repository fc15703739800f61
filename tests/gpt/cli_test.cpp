// The gpt command line: --help, config files, and clear errors for bad values.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "gpt/cli.h"
#include "gpt/device.h"
#include "support/expect.h"
#include "support/ranks.h"

namespace {

struct Parsed {
  int code;
  gpt::Command command;
  std::string out;
  std::string err;
};

Parsed parse(const std::vector<std::string>& args) {
  Parsed p;
  std::ostringstream out, err;
  p.code = gpt::parse_command_line(args, p.command, out, err);
  p.out = out.str();
  p.err = err.str();
  return p;
}

void expect_error(const std::vector<std::string>& args, const std::string& needle) {
  auto p = parse(args);
  std::string joined;
  for (const auto& a : args) joined += a + " ";
  EXPECT_EQ(p.code, 2) << joined;
  EXPECT_NE(p.err.find(needle), std::string::npos) << joined << "\nstderr: " << p.err;
}

TEST(GptCli, DefaultsTrain) {
  auto p = parse({});
  ASSERT_EQ(p.code, -1) << p.err;
  EXPECT_EQ(p.command.kind, gpt::Command::Kind::kTrain);
  EXPECT_EQ(p.command.train.nproc, 2);
  EXPECT_EQ(p.command.train.mode, gpt::ParallelMode::kAuto);
  EXPECT_EQ(p.command.train.device, "auto");
  EXPECT_EQ(p.command.train.resolved_run_dir(), "runs/gpt");
  EXPECT_EQ(p.command.train.schedule.warmup_steps, 30);  // auto: 10% of 300, at most 30
  EXPECT_EQ(p.command.train.schedule.total_steps, 300);
}

TEST(GptCli, FlagsSetFields) {
  auto p = parse({"train", "--steps", "50", "--n-layer", "2", "--lr", "1e-3", "--mode", "ddp",
                  "--name", "exp1", "--tie-weights", "false", "--resume"});
  ASSERT_EQ(p.code, -1) << p.err;
  const auto& c = p.command.train;
  EXPECT_EQ(c.steps, 50);
  EXPECT_EQ(c.schedule.total_steps, 50);
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_DOUBLE_EQ(c.schedule.max_lr, 1e-3);
  EXPECT_EQ(c.mode, gpt::ParallelMode::kDDP);
  EXPECT_FALSE(c.model.tie_weights);
  EXPECT_TRUE(c.resume);
  EXPECT_EQ(c.resolved_run_dir(), "runs/exp1");
  EXPECT_FALSE(c.cpu_offload);
  auto offload = parse({"train", "--cpu-offload", "--device", "cpu"});
  ASSERT_EQ(offload.code, -1) << offload.err;
  EXPECT_TRUE(offload.command.train.cpu_offload);
  EXPECT_EQ(offload.command.train.device, "cpu");
}

TEST(GptCli, ModelDataAndSamplingFlags) {
  auto p = parse({"--family",
                  "qwen2",
                  "--n-head",
                  "8",
                  "--n-kv-head",
                  "2",
                  "--n-embd",
                  "256",
                  "--intermediate",
                  "512",
                  "--max-positions",
                  "1024",
                  "--rope-theta",
                  "1e6",
                  "--tokenizer",
                  "tok.json",
                  "--data",
                  "a.bin,b.txt",
                  "--data-format",
                  "uint16",
                  "--activation-checkpointing",
                  "--top-p",
                  "0.9",
                  "--temperature",
                  "0"});
  ASSERT_EQ(p.code, -1) << p.err;
  const auto& c = p.command.train;
  EXPECT_EQ(c.model.family, "qwen2");
  EXPECT_EQ(c.model.n_kv_head, 2);
  EXPECT_EQ(c.model.intermediate, 512);
  EXPECT_EQ(c.model.max_positions, 1024);
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 1e6);
  EXPECT_EQ(c.tokenizer_path, "tok.json");
  EXPECT_EQ(c.data_path, "a.bin,b.txt");
  EXPECT_EQ(c.data_format, "uint16");
  EXPECT_TRUE(c.activation_checkpointing);
  EXPECT_DOUBLE_EQ(c.sample.top_p, 0.9);
  EXPECT_DOUBLE_EQ(c.sample.temperature, 0.0);  // greedy
  auto h = parse({"--mode", "hsdp", "--replicas", "2"});
  ASSERT_EQ(h.code, -1) << h.err;
  EXPECT_EQ(h.command.train.mode, gpt::ParallelMode::kHSDP);
  EXPECT_EQ(h.command.train.replicas, 2);
  auto f = parse({"--from", "models/llama"});
  ASSERT_EQ(f.code, -1) << f.err;
  EXPECT_EQ(f.command.train.model.from, "models/llama");
  auto g = parse({"generate", "--model", "hf", "--top-p", "0.5"});
  ASSERT_EQ(g.code, -1) << g.err;
  EXPECT_EQ(g.command.generate.model_dir, "hf");
  auto x = parse({"export", "--run-dir", "runs/a", "--out", "runs/a/hf"});
  ASSERT_EQ(x.code, -1) << x.err;
  EXPECT_EQ(x.command.exported.format, "hf");  // the default: a Hugging Face folder
  EXPECT_EQ(x.command.exported.dtype, "float32");
}

TEST(GptCli, HelpListsFlagsAndExitsZero) {
  auto p = parse({"--help"});
  EXPECT_EQ(p.code, 0);
  for (const char* flag : {"--steps", "--n-layer", "--mode", "--config", "--resume", "--top-k",
                           "--grad-accum", "--checkpoint-interval"}) {
    EXPECT_NE(p.out.find(flag), std::string::npos) << flag;
  }
  auto g = parse({"generate", "--help"});
  EXPECT_EQ(g.code, 0);
  EXPECT_NE(g.out.find("--run-dir"), std::string::npos);
}

TEST(GptCli, BadValuesGiveClearErrors) {
  expect_error({"--steps", "0"}, "--steps");
  expect_error({"--steps", "abc"}, "--steps");
  expect_error({"--lr", "-1"}, "--lr");
  expect_error({"--mode", "tensor"}, "--mode");
  expect_error({"--n-embd", "130", "--n-head", "4"}, "multiple of --n-head");
  expect_error({"--n-head", "4", "--n-kv-head", "3"}, "--n-kv-head");
  expect_error({"--family", "bert"}, "--family");
  expect_error({"--from", "a", "--model-config", "b.json"}, "--from");
  expect_error({"--data-format", "int8"}, "--data-format");
  expect_error({"--top-p", "0"}, "--top-p");
  expect_error({"export", "--run-dir", "r", "--out", "o", "--format", "onnx"}, "--format");
  expect_error({"--warmup", "500", "--steps", "100"}, "--warmup");
  expect_error({"--min-lr", "1", "--lr", "0.1"}, "--min-lr");
  expect_error({"--temperature", "-1"}, "--temperature");
  expect_error({"--mixed-precision", "fp8"}, "--mixed-precision");
  expect_error({"--device", "tpu"}, "--device");
  expect_error({"--no-such-flag"}, "--no-such-flag");
  expect_error({"--name", "a/b"}, "--name");
  expect_error({"generate"}, "--run-dir");
  expect_error({"generate", "--run-dir", "r", "--model", "m"}, "--model");
}

TEST(GptCli, ErrorsSuggestHelpAndCarryNoSourceStamp) {
  auto p = parse({"--steps", "-5"});
  EXPECT_EQ(p.code, 2);
  EXPECT_NE(p.err.find("--help"), std::string::npos) << p.err;
  auto q = parse({"--n-embd", "130", "--n-head", "4"});
  EXPECT_EQ(q.err.find(".cpp:"), std::string::npos) << q.err;
}

TEST(GptCli, JsonConfigFileThenFlagsOverride) {
  const auto dir = tdist::testing::make_temp_dir("gpt-cli");
  const std::string path = dir + "/run.json";
  std::ofstream(path) << R"({"steps": 77, "n_layer": 3, "lr": 0.002, "mode": "single",
                            "tie-weights": false, "prompt": "In the"})";
  auto p = parse({"--config", path, "--steps", "88"});
  ASSERT_EQ(p.code, -1) << p.err;
  EXPECT_EQ(p.command.train.steps, 88);  // the command line wins
  EXPECT_EQ(p.command.train.model.n_layer, 3);
  EXPECT_DOUBLE_EQ(p.command.train.schedule.max_lr, 0.002);
  EXPECT_EQ(p.command.train.mode, gpt::ParallelMode::kSingle);
  EXPECT_FALSE(p.command.train.model.tie_weights);
  EXPECT_EQ(p.command.train.prompt, "In the");
}

TEST(GptCli, KeyValueConfigFile) {
  const auto dir = tdist::testing::make_temp_dir("gpt-cli");
  const std::string path = dir + "/run.toml";
  std::ofstream(path) << "# a comment\nsteps = 12\nbatch_size = 4\nname = \"tiny\"\n";
  auto p = parse({"--config", path});
  ASSERT_EQ(p.code, -1) << p.err;
  EXPECT_EQ(p.command.train.steps, 12);
  EXPECT_EQ(p.command.train.schedule.warmup_steps, 1);  // auto warmup follows --steps
  EXPECT_EQ(p.command.train.batch_size, 4);
  EXPECT_EQ(p.command.train.name, "tiny");
}

TEST(GptCli, BadConfigFilesGiveClearErrors) {
  const auto dir = tdist::testing::make_temp_dir("gpt-cli");
  std::ofstream(dir + "/unknown.json") << R"({"stepz": 3})";
  expect_error({"--config", dir + "/unknown.json"}, "stepz");
  std::ofstream(dir + "/broken.json") << R"({"steps": )";
  expect_error({"--config", dir + "/broken.json"}, "JSON");
  std::ofstream(dir + "/bad_value.json") << R"({"steps": -3})";
  expect_error({"--config", dir + "/bad_value.json"}, "steps");
  expect_error({"--config", dir + "/missing.json"}, "missing.json");
}

// --device: the CPU always; auto takes the GPUs only when each local rank gets one (so the
// ranks of a node agree); cuda refuses what it cannot have, naming the fix.
TEST(GptDevice, ResolvesCpuAutoAndCuda) {
  EXPECT_EQ(gpt::resolve_device("cpu", 0, 1), c10::Device(c10::kCPU));
  EXPECT_THROW(gpt::resolve_device("gpu", 0, 1), tdist::InvalidArgument);
  EXPECT_EQ(gpt::backend_for(c10::Device(c10::kCPU), true), "gloo");
  EXPECT_EQ(gpt::backend_for(c10::Device(c10::kCUDA, 0), true), "cpu:gloo,cuda:nccl");
  EXPECT_EQ(gpt::backend_for(c10::Device(c10::kCUDA, 0), false), "gloo");
  if (!tdist::testing::has_gpu()) {
    EXPECT_EQ(gpt::resolve_device("auto", 0, 1), c10::Device(c10::kCPU));
    const std::string message = tdist::testing::error_of([] { gpt::resolve_device("cuda", 0, 1); });
    EXPECT_NE(message.find("no CUDA GPU"), std::string::npos) << message;
    EXPECT_NE(message.find("--device cpu"), std::string::npos) << message;
    return;
  }
  const int gpus = static_cast<int>(at::getNumGPUs());
  EXPECT_EQ(gpt::resolve_device("auto", 0, 1), c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(gpt::resolve_device("cuda", gpus - 1, gpus), c10::Device(c10::kCUDA, gpus - 1));
  EXPECT_EQ(gpt::resolve_device("auto", 0, gpus + 1), c10::Device(c10::kCPU));
  const std::string message =
      tdist::testing::error_of([&] { gpt::resolve_device("cuda", gpus, gpus + 1); });
  EXPECT_NE(message.find("LOCAL_RANK=" + std::to_string(gpus)), std::string::npos) << message;
}

}  // namespace

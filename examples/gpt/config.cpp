#include "gpt/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "tdist/error.h"

namespace gpt {

std::string to_string(ParallelMode mode) {
  switch (mode) {
    case ParallelMode::kAuto:
      return "auto";
    case ParallelMode::kSingle:
      return "single";
    case ParallelMode::kDDP:
      return "ddp";
    case ParallelMode::kFSDP:
      return "fsdp";
    case ParallelMode::kHSDP:
      return "hsdp";
  }
  return "?";
}

ParallelMode parse_parallel_mode(const std::string& text) {
  if (text == "auto") return ParallelMode::kAuto;
  if (text == "single") return ParallelMode::kSingle;
  if (text == "ddp") return ParallelMode::kDDP;
  if (text == "fsdp") return ParallelMode::kFSDP;
  if (text == "hsdp") return ParallelMode::kHSDP;
  TDIST_THROW(tdist::InvalidArgument,
              "--mode must be one of auto, single, ddp, fsdp, hsdp; got '" + text + "'");
}

void TrainConfig::finalize() {
  schedule.total_steps = steps;
  if (schedule.warmup_steps == -1) {
    schedule.warmup_steps = std::min<int64_t>(30, steps / 10);
  }
}

void TrainConfig::validate() const {
  auto check = [](bool ok, const std::string& message) {
    if (!ok) TDIST_THROW(tdist::InvalidArgument, message);
  };
  model.validate();
  check(steps >= 1, "--steps must be >= 1, got " + std::to_string(steps));
  check(batch_size >= 1, "--batch-size must be >= 1, got " + std::to_string(batch_size));
  check(grad_accum >= 1, "--grad-accum must be >= 1, got " + std::to_string(grad_accum));
  auto s = schedule;
  s.total_steps = steps;
  s.validate();
  check(weight_decay >= 0.0, "--weight-decay must be >= 0, got " + std::to_string(weight_decay));
  check(beta1 >= 0.0 && beta1 < 1.0, "--beta1 must be in [0, 1), got " + std::to_string(beta1));
  check(beta2 >= 0.0 && beta2 < 1.0, "--beta2 must be in [0, 1), got " + std::to_string(beta2));
  check(
      optimizer_impl == "fused" || optimizer_impl == "foreach" || optimizer_impl == "for-loop" ||
          optimizer_impl == "default",
      "--optimizer-impl must be fused, foreach, for-loop or default, got '" + optimizer_impl + "'");
  check(grad_clip >= 0.0,
        "--grad-clip must be >= 0 (0 disables clipping), got " + std::to_string(grad_clip));
  check(mixed_precision == "none" || mixed_precision == "bf16",
        "--mixed-precision must be 'none' or 'bf16', got '" + mixed_precision + "'");
  check(device == "cpu" || device == "cuda" || device == "auto",
        "--device must be 'cpu', 'cuda' or 'auto', got '" + device + "'");
  check(data_format == "auto" || data_format == "text" || data_format == "uint16" ||
            data_format == "uint32",
        "--data-format must be auto, text, uint16 or uint32, got '" + data_format + "'");
  check(val_fraction > 0.0 && val_fraction < 0.5,
        "--val-fraction must be in (0, 0.5), got " + std::to_string(val_fraction));
  check(eval_interval >= 0, "--eval-interval must be >= 0, got " + std::to_string(eval_interval));
  check(eval_batches >= 1, "--eval-batches must be >= 1, got " + std::to_string(eval_batches));
  check(log_interval >= 1, "--log-interval must be >= 1, got " + std::to_string(log_interval));
  check(nproc >= 1 && nproc <= 256, "--nproc must be in [1, 256], got " + std::to_string(nproc));
  check(threads >= 0, "--threads must be >= 0 (0: cores / ranks), got " + std::to_string(threads));
  check(timeout_s >= 1, "--timeout must be >= 1 second, got " + std::to_string(timeout_s));
  check(tp >= 1, "--tp must be >= 1, got " + std::to_string(tp));
  check(replicas >= 0,
        "--replicas must be >= 0 (0: one per node), got " + std::to_string(replicas));
  check(checkpoint_interval >= 0, "--checkpoint-interval must be >= 0 (0: never), got " +
                                      std::to_string(checkpoint_interval));
  check(
      !name.empty() && name.find('/') == std::string::npos,
      "--name must be non-empty and contain no '/', got '" + name + "' (use --run-dir for a path)");
  sample.validate();
}

nlohmann::json to_json(const TrainConfig& c) {
  return {
      {"model", to_json(c.model)},
      {"tokenizer", c.tokenizer_path},
      {"data", c.data_path},
      {"data_format", c.data_format},
      {"val_fraction", c.val_fraction},
      {"steps", c.steps},
      {"batch_size", c.batch_size},
      {"grad_accum", c.grad_accum},
      {"lr", c.schedule.max_lr},
      {"min_lr", c.schedule.min_lr},
      {"warmup", c.schedule.warmup_steps},
      {"weight_decay", c.weight_decay},
      {"beta1", c.beta1},
      {"beta2", c.beta2},
      {"grad_clip", c.grad_clip},
      {"optimizer_impl", c.optimizer_impl},
      {"seed", c.seed},
      {"mixed_precision", c.mixed_precision},
      {"activation_checkpointing", c.activation_checkpointing},
      {"eval_interval", c.eval_interval},
      {"eval_batches", c.eval_batches},
      {"mode", to_string(c.mode)},
      {"device", c.device},
      {"cpu_offload", c.cpu_offload},
      {"replicas", c.replicas},
      {"tp", c.tp},
      {"nproc", c.nproc},
      {"name", c.name},
      {"run_dir", c.resolved_run_dir()},
      {"checkpoint_interval", c.checkpoint_interval},
      {"async_checkpoint", c.async_checkpoint},
  };
}

std::string TrainConfig::resolved_token_cache() const {
  if (!token_cache.empty()) return token_cache;
  return (std::filesystem::path(resolved_run_dir()).parent_path() / ".tokens").string();
}

namespace {

// $env, else `source` (a path in the source tree this binary was built from), else `local`.
std::string bundled_file(const char* env_name, const char* source, const char* local) {
  if (const char* env = std::getenv(env_name); env != nullptr && *env != '\0') return env;
  struct stat st {};
  if (source != nullptr && ::stat(source, &st) == 0) return source;
  return local;
}

}  // namespace

std::string default_data_path() {
#ifdef TDIST_GPT_SOURCE_DATA
  return bundled_file("TDIST_GPT_DATA", TDIST_GPT_SOURCE_DATA, "data/kjv.txt");
#else
  return bundled_file("TDIST_GPT_DATA", nullptr, "data/kjv.txt");
#endif
}

std::string default_tokenizer_path() {
#ifdef TDIST_GPT_SOURCE_TOKENIZER
  return bundled_file("TDIST_GPT_TOKENIZER", TDIST_GPT_SOURCE_TOKENIZER,
                      "data/tokenizer/tokenizer.json");
#else
  return bundled_file("TDIST_GPT_TOKENIZER", nullptr, "data/tokenizer/tokenizer.json");
#endif
}

}  // namespace gpt

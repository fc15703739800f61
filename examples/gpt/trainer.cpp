#include "gpt/trainer.h"

#include <signal.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include <torch/torch.h>

#include "gpt/autocast.h"
#include "gpt/checkpointing.h"
#include "gpt/cli.h"
#include "gpt/dataset.h"
#include "gpt/generate.h"
#include "gpt/launcher.h"
#include "gpt/memory.h"
#include "gpt/metrics.h"
#include "gpt/parallel.h"
#include "gpt/plot.h"
#include "gpt/progress.h"
#include "gpt/trace.h"
#include "tdist/error.h"
#include "tdist/fsdp/deferred_init.h"
#include "tdist/models/pretrained.h"
#include "tdist/models/tokenizer.h"
#include "tdist/optim/adam.h"

namespace gpt {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int default_threads(const World& world) {
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  int ranks_here = world.world_size;
  if (local != nullptr && *local != '\0') ranks_here = std::max(1, std::atoi(local));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / ranks_here);
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

std::unique_ptr<torch::optim::AdamW> make_optimizer(Parallel& parallel, const TrainConfig& c) {
  auto groups = parallel.param_groups();
  auto base = tdist::optim::AdamWOptions(c.schedule.max_lr)
                  .betas({c.beta1, c.beta2})
                  .eps(1e-8)
                  .weight_decay(c.weight_decay)
                  .implementation(tdist::optim::implementation_from_string(c.optimizer_impl));
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  if (!groups.decay.empty()) {
    param_groups.emplace_back(groups.decay, std::make_unique<tdist::optim::AdamWOptions>(base));
  }
  if (!groups.no_decay.empty()) {
    auto no_decay = base;
    no_decay.weight_decay(0.0);
    param_groups.emplace_back(groups.no_decay,
                              std::make_unique<tdist::optim::AdamWOptions>(no_decay));
  }
  return std::make_unique<tdist::optim::AdamW>(param_groups, base);
}

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), targets.reshape({-1}));
}

// Mean validation loss over eval_batches batches per rank (the same batches every time, so
// successive values compare), averaged over ranks. Collective.
double evaluate(Parallel& parallel, const PackedLoader& val_loader, const TrainConfig& c,
                const World& world, Tracer& tracer, bool autocast_bf16) {
  TraceSpan span(tracer, "validation", "eval");
  torch::NoGradGuard no_grad;
  AutocastGuard autocast(autocast_bf16, world.device.type());
  auto& model = parallel.model();
  const bool was_training = model->is_training();
  model->eval();
  double total = 0.0;
  for (int64_t i = 0; i < c.eval_batches; ++i) {
    auto batch = val_loader.get(/*position=*/0, /*micro=*/i).to(world.device);
    total += cross_entropy(parallel.forward_eval(batch.x), batch.y).item<double>();
  }
  if (was_training) model->train();
  return all_mean(world, {total / static_cast<double>(c.eval_batches)})[0];
}

int env_int(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr && *env != '\0' ? std::atoi(env) : 0;
}

// tdistrun's failure restarts so far (TORCHELASTIC_RESTART_COUNT): 0 on the first attempt.
int restart_count() {
  return env_int("TORCHELASTIC_RESTART_COUNT");
}

// tdistrun's restarts of any kind so far (TDIST_ELASTIC_ROUND): after a failure, and after a
// node joined an elastic job (which does not count as a failure restart).
int elastic_round() {
  return env_int("TDIST_ELASTIC_ROUND");
}

// Fault injection for the restart test (tests/gpt/restart_test.cpp):
// TDIST_GPT_CRASH_AT_STEP=k makes rank TDIST_GPT_CRASH_RANK (default 1) SIGKILL itself
// before step k+1 (after k steps), on the first attempt only, so that a restarted job
// (tdistrun --max-restarts) runs through. TDIST_GPT_CRASH_SIGNAL=STOP stops it instead
// (SIGSTOP: a process that vanishes with its sockets open, found by heartbeats).
void maybe_crash(int64_t steps_done, const World& world) {
  const char* at = std::getenv("TDIST_GPT_CRASH_AT_STEP");
  if (at == nullptr || *at == '\0' || std::atoll(at) != steps_done || restart_count() > 0) return;
  const char* rank = std::getenv("TDIST_GPT_CRASH_RANK");
  if (world.rank != (rank != nullptr && *rank != '\0' ? std::atoi(rank) : 1)) return;
  const char* signal = std::getenv("TDIST_GPT_CRASH_SIGNAL");
  const bool stop = signal != nullptr && std::string(signal) == "STOP";
  std::cout.flush();
  std::cerr << "gpt: rank " << world.rank << ": TDIST_GPT_CRASH_AT_STEP=" << at << ": "
            << (stop ? "stopping" : "killing") << " myself after step " << steps_done << std::endl;
  ::raise(stop ? SIGSTOP : SIGKILL);
}

// A resumed run continues metrics.jsonl: drop what an interrupted attempt logged after the
// checkpoint, so that every step appears exactly once.
void truncate_metrics_after(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::vector<std::string> keep;
  std::string line;
  while (std::getline(in, line)) {
    auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_discarded() && record.value("step", int64_t{0}) > step) continue;
    keep.push_back(line);
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : keep) out << l << "\n";
}

std::string human_count(int64_t n) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2);
  if (n >= 1000000)
    out << n / 1e6 << "M";
  else if (n >= 1000)
    out << std::setprecision(1) << n / 1e3 << "k";
  else
    out << n;
  return out.str();
}

// The tokenizer: --tokenizer, else the fine-tuned folder's, else the bundled one.
std::string tokenizer_path(const TrainConfig& c) {
  if (!c.tokenizer_path.empty()) return c.tokenizer_path;
  if (!c.model.from.empty()) {
    c.model.check_from_folder();
    for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
      if (fs::is_regular_file(fs::path(c.model.from) / name)) {
        return (fs::path(c.model.from) / name).string();
      }
    }
    TDIST_THROW(tdist::InvalidArgument,
                "--from " + c.model.from +
                    " has no tokenizer.json or tokenizer.model; pass --tokenizer FILE");
  }
  return default_tokenizer_path();
}

// A special token named by tokenizer_config.json beside the tokenizer ("bos_token",
// "eos_token": a string or {"content": ...}), as transformers reads it.
std::optional<int64_t> special_token(const tdist::models::Tokenizer& tokenizer,
                                     const std::string& tokenizer_file, const std::string& key) {
  std::ifstream in(fs::path(tokenizer_file).parent_path() / "tokenizer_config.json");
  if (!in) return std::nullopt;
  const auto json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains(key)) return std::nullopt;
  const auto& value = json[key];
  const std::string token = value.is_string() ? value.get<std::string>()
                            : value.is_object() && value.contains("content")
                                ? value["content"].get<std::string>()
                                : std::string();
  return token.empty() ? std::nullopt : tokenizer.token_to_id(token);
}

// The model's config, checked against the tokenizer and the sequence length.
tdist::models::ModelConfig model_config(const TrainConfig& c,
                                        const tdist::models::Tokenizer& tokenizer,
                                        const std::string& tokenizer_file) {
  const auto bos = special_token(tokenizer, tokenizer_file, "bos_token");
  const auto eos = special_token(tokenizer, tokenizer_file, "eos_token");
  auto config = c.model.resolve(tokenizer.vocab_size(), bos, eos);
  TDIST_CHECK_ARG(
      tokenizer.vocab_size() <= config.vocab_size,
      "the tokenizer " + tokenizer_file + " has " + std::to_string(tokenizer.vocab_size()) +
          " tokens, more than the model's vocab_size " + std::to_string(config.vocab_size) +
          ": its ids would index past the embedding. Pass the model's own "
          "tokenizer (--tokenizer)");
  TDIST_CHECK_ARG(c.model.block_size <= config.max_position_embeddings,
                  "--block-size " + std::to_string(c.model.block_size) +
                      " is longer than the model's max_position_embeddings (" +
                      std::to_string(config.max_position_embeddings) + "); lower --block-size");
  return config;
}

// The token stream of every --data file (comma-separated), text tokenized once into the
// cache by rank 0 while the others wait.
torch::Tensor load_tokens(const TrainConfig& c, const tdist::models::Tokenizer& tokenizer,
                          const std::string& tokenizer_file, std::optional<int64_t> eos,
                          int64_t vocab_size, const World& world) {
  const DataFormat requested = parse_data_format(c.data_format);
  std::vector<torch::Tensor> parts;
  std::stringstream list(c.data_path);
  std::string path;
  while (std::getline(list, path, ',')) {
    if (path.empty()) continue;
    const DataFormat format = format_of(path, requested);
    if (format != DataFormat::kText) {
      parts.push_back(read_token_file(path, format, vocab_size));
      continue;
    }
    const std::string cache = token_cache_path(c.resolved_token_cache(), path, tokenizer_file, eos);
    if (world.is_main() && !fs::exists(cache)) write_token_cache(path, tokenizer, eos, cache);
    barrier(world);
    parts.push_back(read_token_file(cache, DataFormat::kUint32, vocab_size));
  }
  TDIST_CHECK_ARG(!parts.empty(), "--data names no file");
  return parts.size() == 1 ? parts[0] : torch::cat(parts);
}

// <run_dir>/model/: config.json and the tokenizer's files, what export and generate read.
void write_model_files(const std::string& run_dir, const tdist::models::ModelConfig& config,
                       const std::string& tokenizer_file) {
  const fs::path dir = model_files_dir(run_dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.to_json() << "\n";
  const fs::path from = fs::path(tokenizer_file).parent_path();
  fs::copy_file(tokenizer_file, dir / fs::path(tokenizer_file).filename(),
                fs::copy_options::overwrite_existing);
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    if (fs::is_regular_file(from / name)) {
      fs::copy_file(from / name, dir / name, fs::copy_options::overwrite_existing);
    }
  }
}

int64_t count_parameters(const tdist::models::ModelConfig& config) {
  tdist::fsdp::MetaDeviceGuard meta;
  int64_t n = 0;
  for (const auto& p : tdist::models::build_model(config)->parameters()) n += p.numel();
  return n;
}

}  // namespace

TrainResult train(const TrainConfig& config, const World& world, std::ostream& out) {
  TrainConfig c = config;
  // Restarted by tdistrun (after a failure, or at a new size): continue from the newest
  // checkpoint.
  if (restart_count() > 0 || elastic_round() > 0) c.resume = true;
  c.finalize();
  c.validate();
  if (c.data_path.empty()) c.data_path = default_data_path();
  const std::string run_dir = c.resolved_run_dir();
  const bool main = world.is_main();
  const bool show = main && !c.quiet;

  torch::set_num_threads(c.threads > 0 ? c.threads : default_threads(world));
  TrainResult result;
  // --cpu-offload shards even one rank's model (FSDP at world 1).
  const ParallelMode mode = resolve_mode(
      c.cpu_offload && c.mode == ParallelMode::kAuto ? ParallelMode::kFSDP : c.mode, world);
  result.mode = to_string(mode);

  // Outputs.
  if (main) fs::create_directories(run_dir);
  barrier(world);
  Tracer tracer(world.rank, c.trace);

  // Tokenizer, model config and data: every rank reads them; rank 0 tokenizes text once.
  const std::string tokenizer_file = tokenizer_path(c);
  const auto tokenizer = tdist::models::Tokenizer::from_file(tokenizer_file);
  const tdist::models::ModelConfig model_cfg = model_config(c, tokenizer, tokenizer_file);
  const std::optional<int64_t> eos = model_cfg.eos_token_ids.empty()
                                         ? std::nullopt
                                         : std::optional<int64_t>(model_cfg.eos_token_ids.front());
  const torch::Tensor tokens =
      load_tokens(c, tokenizer, tokenizer_file, eos, model_cfg.vocab_size, world);
  const int64_t block = c.model.block_size;
  const int64_t n_val = static_cast<int64_t>(static_cast<double>(tokens.numel()) * c.val_fraction);
  TDIST_CHECK_ARG(n_val >= block + 1 && tokens.numel() - n_val >= block + 1,
                  "--data holds " + std::to_string(tokens.numel()) +
                      " tokens, too few for a training and a validation sequence of --block-size " +
                      std::to_string(block) + " with --val-fraction " +
                      std::to_string(c.val_fraction) + "; use more data or a smaller --block-size");
  // --tp: the tp ranks of one model replica read the same batches, so the data is split over
  // the world / tp replicas (the mesh (dp, tp) is row-major: dp rank = rank / tp).
  TDIST_CHECK_ARG(c.tp == 1 || (mode == ParallelMode::kFSDP && world.world_size % c.tp == 0),
                  "--tp " + std::to_string(c.tp) + " needs --mode fsdp (got " + to_string(mode) +
                      ") and a world size it divides (got " + std::to_string(world.world_size) +
                      ")");
  const int data_rank = static_cast<int>(world.rank / c.tp);
  const int data_ranks = static_cast<int>(world.world_size / c.tp);
  const torch::Tensor train_tokens = tokens.narrow(0, 0, tokens.numel() - n_val);
  const torch::Tensor val_tokens = tokens.narrow(0, tokens.numel() - n_val, n_val);
  PackedLoader train_loader(train_tokens, block, c.batch_size, data_rank, data_ranks, c.grad_accum,
                            c.seed, /*shuffle=*/true);
  // Validation: eval_batches "micro-steps" at position 0, the same sequences every time.
  PackedLoader val_loader(val_tokens, block, c.batch_size, data_rank, data_ranks, c.eval_batches,
                          c.seed, /*shuffle=*/false);

  // Model: pretraining builds it on the meta device and initialises it from per-module seeds
  // (after sharding under FSDP, so each rank allocates only its shards); fine-tuning loads
  // the folder (straight into shards under FSDP).
  const bool fsdp = mode == ParallelMode::kFSDP || mode == ParallelMode::kHSDP;
  const ParallelOptions parallel_options{
      c.cpu_offload, fsdp && c.mixed_precision == "bf16",
      mode == ParallelMode::kHSDP ? resolve_replicas(c.replicas, world) : 1, c.tp};
  if (fsdp) ensure_process_group(world);
  Model model;
  std::function<void(Model&)> materialize_fn;
  if (!c.model.from.empty()) {
    model = tdist::models::from_pretrained(
        c.model.from, tdist::models::LoadOptions()
                          .dtype(torch::kFloat)
                          .device(c.cpu_offload ? torch::Device(torch::kCPU) : world.device)
                          .fully_shard(fsdp && c.tp == 1)
                          .fsdp_options(fsdp_options(world, parallel_options)));
  } else {
    {
      tdist::fsdp::MetaDeviceGuard meta;  // shapes only: materialize_fn allocates
      model = tdist::models::build_model(model_cfg);
    }
    const auto device = c.cpu_offload ? torch::Device(torch::kCPU) : world.device;
    materialize_fn = [&c, &model_cfg, device](Model& m) {
      tdist::fsdp::materialize(
          m, tdist::fsdp::MaterializeOptions().seed(c.seed).device(device).init_fn(
                 tdist::models::init_weights_fn(model_cfg)));
    };
  }
  const int64_t n_params = count_parameters(model_cfg);
  model->set_activation_checkpointing(c.activation_checkpointing);
  auto parallel = make_parallel(mode, model, world, tracer, parallel_options, materialize_fn);
  // bf16 without FSDP's policy: autocast around forward.
  const bool autocast_bf16 = c.mixed_precision == "bf16" && !fsdp;
  auto optimizer = make_optimizer(*parallel, c);
  Checkpointer checkpointer(run_dir, world, c.async_checkpoint);

  if (!c.resume && main) {
    // A fresh run under an existing name replaces the old run's checkpoints, so a later
    // --resume never mixes two runs.
    std::error_code ec;
    if (fs::exists(checkpointer.root(), ec) && !fs::is_empty(checkpointer.root(), ec)) {
      fs::remove_all(checkpointer.root(), ec);
      if (show) {
        out << "note: removed the checkpoints of an earlier run in " << checkpointer.root()
            << " (pass --resume to continue a run instead)\n";
      }
    }
  }
  barrier(world);
  int64_t data_position = 0;
  if (c.resume) {
    if (auto resumed = checkpointer.load_latest(*parallel, *optimizer)) {
      result.start_step = resumed->step;
      data_position = resumed->data_position;
    } else if (show) {
      out << "resume: no checkpoint in " << checkpointer.root() << ", starting fresh\n";
    }
  }
  TDIST_CHECK_ARG(result.start_step <= c.steps, "--resume: the newest checkpoint is at step " +
                                                    std::to_string(result.start_step) +
                                                    ", past --steps " + std::to_string(c.steps) +
                                                    "; raise --steps");

  std::unique_ptr<MetricsWriter> metrics;
  if (main) {
    std::ofstream(config_path(run_dir)) << to_json(c).dump(2) << "\n";
    write_model_files(run_dir, model_cfg, tokenizer_file);
    const std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
    if (result.start_step > 0) truncate_metrics_after(metrics_path, result.start_step);
    metrics = std::make_unique<MetricsWriter>(metrics_path, /*append=*/result.start_step > 0);
  }
  const int64_t tokens_per_step = c.batch_size * block * c.grad_accum * data_ranks;
  if (show) {
    out << "gpt: " << human_count(n_params) << " parameters ("
        << tdist::models::architecture_of(model_cfg.family) << ", " << c.model.describe() << ")\n"
        << "     " << world.world_size << (world.world_size == 1 ? " rank" : " ranks") << ", mode "
        << result.mode << (c.tp > 1 ? " x tp " + std::to_string(c.tp) : std::string()) << ", "
        << world.device.str() << ", " << torch::get_num_threads() << " thread(s) per rank\n"
        << "data: " << c.data_path << " (" << human_count(train_tokens.numel()) << " train / "
        << human_count(val_tokens.numel()) << " val tokens; tokenizer " << tokenizer_file << ", "
        << tokenizer.vocab_size() << " tokens)\n"
        << "batch: " << c.batch_size << " x " << block << " tokens x " << data_ranks
        << (c.tp > 1 ? " model replica(s) x " : " rank(s) x ") << c.grad_accum
        << " accum = " << tokens_per_step << " tokens/step; " << c.steps << " steps, lr "
        << c.schedule.max_lr << " (warmup " << c.schedule.warmup_steps << ", cosine to "
        << c.schedule.min_lr << ")\n"
        << "run dir: " << run_dir << "  (checkpoints: " << Checkpointer::backend_name() << ")\n";
    if (result.start_step > 0) {
      out << "resumed from step " << result.start_step;
      if (restart_count() > 0) {
        out << " (tdistrun restart " << restart_count() << ")";
      } else if (elastic_round() > 0) {
        out << " (tdistrun round " << elastic_round() << ": the job's nodes changed)";
      }
      out << "\n";
    }
    out.flush();
  }

  ProgressBar progress(out, ProgressBar::stdout_is_tty() && &out == &std::cout, c.log_interval);
  auto log_val = [&](int64_t step, double loss) {
    result.val_loss.emplace_back(step, loss);
    if (main) metrics->write({{"kind", "val"}, {"step", step}, {"loss", loss}});
    if (show) {
      std::ostringstream line;
      line << "step " << step << ": validation loss " << std::fixed << std::setprecision(4) << loss;
      progress.message(line.str());
    }
  };
  if (result.start_step == 0) {
    log_val(0, evaluate(*parallel, val_loader, c, world, tracer, autocast_bf16));
  }

  // Training loop.
  parallel->model()->train();
  const auto start = Clock::now();
  std::deque<double> recent_step_s;
  for (int64_t step = result.start_step; step < c.steps; ++step) {
    maybe_crash(step, world);
    const auto step_start = Clock::now();
    const double lr = c.schedule.at(step);
    set_learning_rate(*optimizer, lr);
    double loss_sum = 0.0;
    for (int64_t micro = 0; micro < c.grad_accum; ++micro) {
      auto batch = train_loader.get(data_position, micro).to(world.device);
      torch::Tensor loss;
      {
        TraceSpan span(tracer, "forward", "compute");
        AutocastGuard autocast(autocast_bf16, world.device.type());
        const bool sync = micro == c.grad_accum - 1;
        loss = parallel->loss(batch.x, batch.y, sync) / static_cast<double>(c.grad_accum);
      }
      {
        TraceSpan span(tracer, "backward", "compute");
        parallel->backward(loss);
      }
      loss_sum += loss.item<double>();
    }
    data_position += train_loader.global_batch();
    double grad_norm = 0.0;
    {
      TraceSpan span(tracer, "optimizer", "compute");
      torch::Tensor norm;
      if (c.grad_clip > 0.0) norm = parallel->clip_grad_norm(c.grad_clip);
      optimizer->step();
      optimizer->zero_grad();
      if (norm.defined()) grad_norm = norm.item<double>();  // read after the step is queued
    }
    const double loss = all_mean(world, {loss_sum})[0];
    const auto rss = all_gather_values(world, static_cast<double>(memory_usage().rss_bytes));
    // GPU memory per rank (zeros on the CPU, without the collective).
    const DeviceMemoryUsage gpu = device_memory_usage(world.device);
    const auto on_device = world.device.is_cuda()
                               ? all_gather_values(world, static_cast<double>(gpu.allocated_bytes))
                               : std::vector<double>(static_cast<size_t>(world.world_size), 0.0);
    result.train_loss.push_back(loss);
    const int64_t done = step + 1;
    result.steps_done = done;

    const double step_s = seconds_since(step_start);
    recent_step_s.push_back(step_s);
    if (recent_step_s.size() > 20) recent_step_s.pop_front();
    double recent = 0.0;
    for (double s : recent_step_s) recent += s;
    recent /= static_cast<double>(recent_step_s.size());
    const double elapsed = seconds_since(start);
    const double tok_s =
        static_cast<double>(tokens_per_step) * (done - result.start_step) / elapsed;

    if (main) {
      std::vector<int64_t> rss_bytes(rss.begin(), rss.end());
      metrics->write({{"kind", "train"},
                      {"step", done},
                      {"loss", loss},
                      {"lr", lr},
                      {"grad_norm", grad_norm},
                      {"tokens_per_s", tok_s},
                      {"step_ms", step_s * 1e3},
                      {"rss_bytes", rss_bytes},
                      {"peak_rss_bytes", memory_usage().peak_bytes},
                      {"device_bytes", std::vector<int64_t>(on_device.begin(), on_device.end())},
                      {"peak_device_bytes", gpu.peak_bytes},
                      {"time_s", elapsed}});
      if (show) {
        ProgressState state;
        state.step = done;
        state.total = c.steps;
        state.loss = loss;
        state.lr = lr;
        state.tokens_per_s = static_cast<double>(tokens_per_step) / recent;
        state.eta_s = recent * static_cast<double>(c.steps - done);
        state.rank_memory_bytes = rss_bytes;
        progress.update(state);
      }
    }
    if (!std::isfinite(loss)) {
      TDIST_THROW(tdist::Error, "rank " + std::to_string(world.rank) + ": training loss is " +
                                    std::to_string(loss) + " at step " + std::to_string(done) +
                                    "; lower --lr or enable --grad-clip");
    }
    const bool last = done == c.steps;
    if ((c.eval_interval > 0 && done % c.eval_interval == 0) || last) {
      log_val(done, evaluate(*parallel, val_loader, c, world, tracer, autocast_bf16));
    }
    if (c.checkpoint_interval > 0 && (done % c.checkpoint_interval == 0 || last)) {
      TraceSpan span(tracer, "checkpoint", "io");
      checkpointer.save(done, data_position, *parallel, *optimizer);
    }
  }
  checkpointer.wait();  // the last checkpoint is on disk before the run's outputs
  if (show) progress.finish();
  result.seconds = seconds_since(start);
  result.tokens_per_s = result.seconds > 0
                            ? static_cast<double>(tokens_per_step) *
                                  (result.steps_done - result.start_step) / result.seconds
                            : 0.0;

  // Outputs of the run.
  if (c.trace) {
    tracer.write(
        (fs::path(run_dir) / ("trace_rank" + std::to_string(world.rank) + ".json")).string());
  }
  if (main) {
    write_loss_plot((fs::path(run_dir) / "metrics.jsonl").string(),
                    (fs::path(run_dir) / "loss.svg").string(),
                    tdist::models::architecture_of(model_cfg.family) + " on " +
                        fs::path(c.data_path).filename().string() + " (" +
                        std::to_string(world.world_size) + " rank(s), " + result.mode + ")");
  }
  if (c.sample.max_new_tokens > 0) {
    TraceSpan span(tracer, "generate", "eval");
    // The sample stays within the model's positions.
    SampleOptions sample = c.sample;
    const auto prompt_tokens = static_cast<int64_t>(tokenizer.encode(c.prompt).size());
    sample.max_new_tokens = std::max<int64_t>(
        0, std::min(sample.max_new_tokens, model_cfg.max_position_embeddings - prompt_tokens));
    if (parallel->replicated()) {
      if (main) result.sample = generate_text(*parallel->model(), tokenizer, c.prompt, sample);
    } else {
      // Sharded: every rank samples in lockstep (each forward is collective); the same
      // seed gives every rank the same tokens.
      auto text = generate_text(*parallel->model(), tokenizer, c.prompt, sample,
                                [&](const torch::Tensor& ids, tdist::models::KVCache* cache) {
                                  return parallel->forward_eval(ids, cache);
                                });
      if (main) result.sample = text;
    }
  }
  barrier(world);

  if (show) {
    out << "done: " << (result.steps_done - result.start_step) << " steps in "
        << ProgressBar::format_duration(result.seconds) << ", "
        << ProgressBar::format_rate(result.tokens_per_s) << " tokens/s";
    if (result.val_loss.size() >= 2) {
      out << std::fixed << std::setprecision(3) << "; validation loss "
          << result.val_loss.front().second << " -> " << result.val_loss.back().second;
    }
    out << "\n";
    if (!result.sample.empty()) {
      out << "--- sample (prompt \"" << c.prompt << "\", temperature " << c.sample.temperature
          << ", top-k " << c.sample.top_k << ", top-p " << c.sample.top_p << ", seed "
          << c.sample.seed << ") ---\n"
          << c.prompt << result.sample << "\n---\n";
    }
    out << "outputs: " << run_dir << "/{metrics.jsonl, loss.svg"
        << (c.trace ? ", trace_rank*.json" : "")
        << (c.checkpoint_interval > 0 ? ", checkpoints/" : "") << ", config.json}\n";
    if (c.checkpoint_interval > 0) {
      out << "sample again: gpt generate --run-dir " << run_dir << " --prompt \"" << c.prompt
          << "\"\n"
          << "for transformers: gpt export --run-dir " << run_dir << " --out " << run_dir
          << "/hf\n";
    }
    out.flush();
  }
  return result;
}

int run_train_command(const TrainConfig& config, const std::vector<std::string>& argv) {
  if (!adopt_launch_environment() && config.nproc > 1) {
    return spawn_local_ranks(config.nproc, argv);
  }
  const char* rank_env = std::getenv("RANK");
  const std::string rank = rank_env != nullptr && *rank_env != '\0' ? rank_env : "0";
  try {
    World world = init_world(config.timeout_s, config.device);
    train(config, world, std::cout);
    shutdown_world(world);
    return 0;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "\ngpt: error (rank " << rank << "): " << user_message(e) << "\n";
    return 1;
  }
}

int run_generate_command(const GenerateConfig& config) {
  try {
    if (config.threads > 0) torch::set_num_threads(config.threads);
    TDIST_CHECK_ARG(config.run_dir.empty() != config.model_dir.empty(),
                    "gpt generate: pass one of --run-dir (a training run) or --model (a Hugging "
                    "Face model folder)");
    const std::string dir =
        config.model_dir.empty() ? model_files_dir(config.run_dir) : config.model_dir;
    Model model = config.model_dir.empty() ? load_model_from_run(config.run_dir)
                                           : tdist::models::from_pretrained(dir);
    std::string tokenizer_file = (fs::path(dir) / "tokenizer.json").string();
    if (!fs::is_regular_file(tokenizer_file))
      tokenizer_file = (fs::path(dir) / "tokenizer.model").string();
    const auto tokenizer = tdist::models::Tokenizer::from_file(tokenizer_file);
    std::cout << config.prompt << generate_text(*model, tokenizer, config.prompt, config.sample)
              << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gpt generate: error: " << user_message(e) << "\n";
    return 1;
  }
}

}  // namespace gpt

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
#include "gpt/corpus.h"
#include "gpt/generate.h"
#include "gpt/launcher.h"
#include "gpt/memory.h"
#include "gpt/metrics.h"
#include "gpt/model.h"
#include "gpt/parallel.h"
#include "gpt/plot.h"
#include "gpt/progress.h"
#include "gpt/trace.h"
#include "tdist/error.h"
#ifdef TDIST_GPT_WITH_FSDP
#include "tdist/fsdp/deferred_init.h"
#endif

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
  auto base = torch::optim::AdamWOptions(c.schedule.max_lr)
                  .betas({c.beta1, c.beta2})
                  .eps(1e-8)
                  .weight_decay(c.weight_decay);
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  if (!groups.decay.empty()) {
    param_groups.emplace_back(groups.decay, std::make_unique<torch::optim::AdamWOptions>(base));
  }
  if (!groups.no_decay.empty()) {
    auto no_decay = base;
    no_decay.weight_decay(0.0);
    param_groups.emplace_back(groups.no_decay,
                              std::make_unique<torch::optim::AdamWOptions>(no_decay));
  }
  return std::make_unique<torch::optim::AdamW>(param_groups, base);
}

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), targets.reshape({-1}));
}

// Mean validation loss over eval_batches batches per rank (the same batches every time, so
// successive values compare), averaged over ranks. Collective.
double evaluate(Parallel& parallel, const BatchSampler& val_sampler, const TrainConfig& c,
                const World& world, Tracer& tracer) {
  TraceSpan span(tracer, "validation", "eval");
  torch::NoGradGuard no_grad;
  AutocastGuard autocast(c.mixed_precision == "bf16", world.device.type());
  auto& model = parallel.model();
  const bool was_training = model->is_training();
  model->eval();
  double total = 0.0;
  for (int64_t i = 0; i < c.eval_batches; ++i) {
    auto batch = val_sampler.get(/*step=*/0, /*micro_step=*/i).to(world.device);
    total += cross_entropy(parallel.forward_eval(batch.x), batch.y).item<double>();
  }
  if (was_training) model->train();
  return all_mean(world, {total / static_cast<double>(c.eval_batches)})[0];
}

// tdistrun's restart round (TORCHELASTIC_RESTART_COUNT): 0 on the first attempt.
int restart_count() {
  const char* env = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return env != nullptr && *env != '\0' ? std::atoi(env) : 0;
}

// Fault injection for the restart test (tests/gpt/restart_test.cpp):
// TDIST_GPT_CRASH_AT_STEP=k makes rank TDIST_GPT_CRASH_RANK (default 1) SIGKILL itself
// before step k+1 (after k steps), on the first attempt only, so that a restarted job
// (tdistrun --max-restarts) runs through.
void maybe_crash(int64_t steps_done, const World& world) {
  const char* at = std::getenv("TDIST_GPT_CRASH_AT_STEP");
  if (at == nullptr || *at == '\0' || std::atoll(at) != steps_done || restart_count() > 0) return;
  const char* rank = std::getenv("TDIST_GPT_CRASH_RANK");
  if (world.rank != (rank != nullptr && *rank != '\0' ? std::atoi(rank) : 1)) return;
  std::cout.flush();
  std::cerr << "gpt: rank " << world.rank << ": TDIST_GPT_CRASH_AT_STEP=" << at
            << ": killing myself after step " << steps_done << std::endl;
  ::raise(SIGKILL);
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

// The model, the same on every rank: initialised from the global seed by its constructor, or
// (--deferred-init) built on the meta device for materialize_model to initialise.
GPT build_model(const TrainConfig& c) {
  if (!c.deferred_init) {
    torch::manual_seed(c.seed);
    return GPT(c.model);
  }
#ifdef TDIST_GPT_WITH_FSDP
  tdist::fsdp::MetaDeviceGuard meta;
  return GPT(c.model);
#else
  TDIST_THROW(tdist::InvalidArgument,
              "--deferred-init needs a gpt built with the fsdp area (-DTDIST_GPT_WITH_FSDP=ON)");
#endif
}

// Deferred init: each module from its own seed (GPT-2's rule), this rank's shards only when
// FSDP has sharded the model already.
void materialize_model(GPT& model, const TrainConfig& c, const torch::Device& device) {
#ifdef TDIST_GPT_WITH_FSDP
  const ModelConfig config = c.model;
  tdist::fsdp::materialize(model,
                           tdist::fsdp::MaterializeOptions().seed(c.seed).device(device).init_fn(
                               [config](const std::string& name, torch::nn::Module& module) {
                                 GPTImpl::init_module(config, name, module);
                               }));
#else
  (void)model;
  (void)c;
  (void)device;
#endif
}

}  // namespace

TrainResult train(const TrainConfig& config, const World& world, std::ostream& out) {
  TrainConfig c = config;
  // Restarted by tdistrun after a failure: continue from the newest checkpoint.
  if (restart_count() > 0) c.resume = true;
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
      c.cpu_offload && c.mode == ParallelMode::kAuto ? ParallelMode::kFsdp : c.mode, world);
  result.mode = to_string(mode);

  // Outputs.
  if (main) fs::create_directories(run_dir);
  barrier(world);
  Tracer tracer(world.rank, c.trace);

  // Data: every rank reads the file; the samplers give each rank its share of a batch.
  Corpus corpus(c.data_path, c.val_fraction, c.model.block_size);
  BatchSampler train_sampler(corpus.train(), c.model.block_size, c.batch_size, world.rank,
                             world.world_size, c.seed, c.grad_accum);
  // Validation: eval_batches "micro-steps" of one fixed step, the same windows every time.
  BatchSampler val_sampler(corpus.val(), c.model.block_size, c.batch_size, world.rank,
                           world.world_size, c.seed + 1, c.eval_batches);

  // Model: the same initialisation on every rank. Deferred init materialises after FSDP has
  // sharded the model (each rank then allocates its shards only), before DDP's broadcast.
  // A model built whole moves to the device before FSDP shards it or DDP replicates it.
  GPT model = build_model(c);
  if (!c.deferred_init) model->to(world.device);
  if (c.deferred_init && mode != ParallelMode::kFsdp) materialize_model(model, c, world.device);
  auto parallel = make_parallel(mode, model, world, tracer, c.cpu_offload);
  if (c.deferred_init && mode == ParallelMode::kFsdp) materialize_model(model, c, world.device);
  auto optimizer = make_optimizer(*parallel, c);
  Checkpointer checkpointer(run_dir, world);

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
  if (c.resume) {
    if (auto step = checkpointer.load_latest(*parallel, *optimizer)) {
      result.start_step = *step;
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
    const std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
    if (result.start_step > 0) truncate_metrics_after(metrics_path, result.start_step);
    metrics = std::make_unique<MetricsWriter>(metrics_path, /*append=*/result.start_step > 0);
  }
  const int64_t tokens_per_step =
      c.batch_size * c.model.block_size * c.grad_accum * world.world_size;
  if (show) {
    out << "gpt: " << human_count(c.model.num_parameters()) << " parameters ("
        << c.model.to_string() << ")\n"
        << "     " << world.world_size << (world.world_size == 1 ? " rank" : " ranks") << ", mode "
        << result.mode << ", " << world.device.str() << ", " << torch::get_num_threads()
        << " thread(s) per rank\n"
        << "data: " << corpus.path() << " (" << human_count(corpus.size_bytes())
        << " bytes: " << human_count(corpus.train().numel()) << " train / "
        << human_count(corpus.val().numel()) << " val tokens)\n"
        << "batch: " << c.batch_size << " x " << c.model.block_size << " tokens x "
        << world.world_size << " rank(s) x " << c.grad_accum << " accum = " << tokens_per_step
        << " tokens/step; " << c.steps << " steps, lr " << c.schedule.max_lr << " (warmup "
        << c.schedule.warmup_steps << ", cosine to " << c.schedule.min_lr << ")\n"
        << "run dir: " << run_dir << "  (checkpoints: " << Checkpointer::backend_name() << ")\n";
    if (result.start_step > 0) {
      out << "resumed from step " << result.start_step;
      if (restart_count() > 0) out << " (tdistrun restart " << restart_count() << ")";
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
  if (result.start_step == 0) log_val(0, evaluate(*parallel, val_sampler, c, world, tracer));

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
      auto batch = train_sampler.get(step, micro).to(world.device);
      torch::Tensor loss;
      {
        TraceSpan span(tracer, "forward", "compute");
        AutocastGuard autocast(c.mixed_precision == "bf16", world.device.type());
        const bool sync = micro == c.grad_accum - 1;
        loss = cross_entropy(parallel->forward(batch.x, sync), batch.y) /
               static_cast<double>(c.grad_accum);
      }
      {
        TraceSpan span(tracer, "backward", "compute");
        parallel->backward(loss);
      }
      loss_sum += loss.item<double>();
    }
    double grad_norm = 0.0;
    {
      TraceSpan span(tracer, "optimizer", "compute");
      if (c.grad_clip > 0.0) grad_norm = parallel->clip_grad_norm(c.grad_clip);
      optimizer->step();
      optimizer->zero_grad();
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
      log_val(done, evaluate(*parallel, val_sampler, c, world, tracer));
    }
    if (c.checkpoint_interval > 0 && (done % c.checkpoint_interval == 0 || last)) {
      TraceSpan span(tracer, "checkpoint", "io");
      checkpointer.save(done, *parallel, *optimizer);
    }
  }
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
                    "GPT on " + fs::path(corpus.path()).filename().string() + " (" +
                        std::to_string(world.world_size) + " rank(s), " + result.mode + ")");
  }
  if (c.sample.max_new_tokens > 0) {
    TraceSpan span(tracer, "generate", "eval");
    if (parallel->replicated()) {
      if (main) result.sample = generate(parallel->model(), c.prompt, c.sample);
    } else {
      // Sharded: every rank samples in lockstep (each forward is collective); the same
      // seed gives every rank the same tokens.
      auto text = generate(parallel->model(), c.prompt, c.sample,
                           [&](const torch::Tensor& idx) { return parallel->forward_eval(idx); });
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
          << ", top-k " << c.sample.top_k << ", seed " << c.sample.seed << ") ---\n"
          << c.prompt << result.sample << "\n---\n";
    }
    out << "outputs: " << run_dir << "/{metrics.jsonl, loss.svg"
        << (c.trace ? ", trace_rank*.json" : "")
        << (c.checkpoint_interval > 0 ? ", checkpoints/" : "") << ", config.json}\n";
    if (c.checkpoint_interval > 0) {
      out << "sample again: gpt generate --run-dir " << run_dir << " --prompt \"" << c.prompt
          << "\"\n";
    }
    out.flush();
  }
  return result;
}

int run_train_command(const TrainConfig& config, const std::vector<std::string>& argv) {
  if (!launched_as_rank() && config.nproc > 1) {
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
    GPT model = load_model_from_run(config.run_dir);
    std::cout << config.prompt << generate(model, config.prompt, config.sample) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gpt generate: error: " << user_message(e) << "\n";
    return 1;
  }
}

}  // namespace gpt

// Training throughput and peak memory per rank of GPT-2 (tdist::models, the trainer's gpt2
// family; transformers' GPT2LMHeadModel on the Python side) under tdist:
// single process, DDP or FSDP (optionally with CPU offload), on the CPU or a GPU. Each run
// prints one row; bench/train/run.sh runs them all beside Python PyTorch on the same model
// (tools/gpu-check.sh on a GPU).
//   bench_train --mode ddp --nproc 2 --steps 20
//   bench_train --mode fsdp --device cuda --n-layer 12 --n-embd 896 --n-head 14
// The benchmark checks what it times: the loss must be finite and the ranks must agree on
// it (column "ok").

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/openblas_kernels.h"
#include "gpt/launcher.h"
#include "gpt/memory.h"
#include "gpt/model_spec.h"
#include "gpt/parallel.h"
#include "gpt/world.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/error.h"
#include "tdist/fsdp/deferred_init.h"
#include "tdist/models/pretrained.h"
#include "tdist/optim/adam.h"

namespace {

gpt::ModelSpec gpt2_spec() {
  gpt::ModelSpec spec;
  spec.family = "gpt2";
  return spec;
}

struct Options {
  std::string mode = "single";
  int nproc = 1;
  int steps = 20;
  int warmup = 3;
  int threads = 0;
  int64_t batch_size = 16;
  // The shape flags of the GPT-2 family of tdist::models (vocabulary: bytes, as gpt_torch.py).
  gpt::ModelSpec model = gpt2_spec();
  int64_t vocab_size = 256;
  std::string json_path;
  std::string init_out;  // rank 0 writes the initial parameters here (PyTorch's .pt format)
  std::string device = "cpu";
  bool cpu_offload = false;
  std::string optimizer_impl = "fused";  // tdist::optim's AdamW: fused, foreach, for-loop
};

int run_rank(const Options& o) {
  gpt::World world = gpt::init_world(300, o.device);
  const int threads =
      o.threads > 0
          ? o.threads
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world.world_size);
  torch::set_num_threads(threads);
  // GPT-2 (transformers' GPT2LMHeadModel, tdist::models), built on the meta device and
  // materialised from seeds as the trainer does (after sharding under FSDP).
  const auto config = o.model.resolve(o.vocab_size, std::nullopt, std::nullopt);
  gpt::Model model;
  {
    tdist::fsdp::MetaDeviceGuard meta;
    model = tdist::models::build_model(config);
  }
  int64_t num_parameters = 0;
  for (const auto& p : model->parameters()) num_parameters += p.numel();
  // Training FLOPs per token as torchtitan counts them: 6 x the parameters that multiply
  // (the tied wte counts once, as the head; the position table is a lookup) plus attention's
  // 12 x layers x width x sequence.
  const auto* wpe = model->named_parameters().find("transformer.wpe.weight");
  const double flops_per_token =
      6.0 * static_cast<double>(num_parameters - (wpe != nullptr ? wpe->numel() : 0)) +
      12.0 * static_cast<double>(o.model.n_layer * o.model.n_embd * o.model.block_size);
  const auto materialize = [&](gpt::Model& m) {
    tdist::fsdp::materialize(m, tdist::fsdp::MaterializeOptions()
                                    .seed(1234)
                                    .device(world.device)
                                    .init_fn(tdist::models::init_weights_fn(config)));
  };
  gpt::Tracer tracer(world.rank, /*enabled=*/false);
  const auto mode = gpt::resolve_mode(gpt::parse_parallel_mode(o.mode), world);
  auto parallel = gpt::make_parallel(mode, model, world, tracer,
                                     gpt::ParallelOptions{o.cpu_offload, false}, materialize);
  if (!o.init_out.empty() && world.rank == 0) {
    // The Python side (gpt_torch.py --init) starts from exactly these weights (transformers'
    // names and layout), so the two sides' losses can be compared step for step.
    TDIST_CHECK_ARG(parallel->replicated(), "--init-out needs --mode single or ddp");
    tdist::checkpoint::export_torch_file(tdist::checkpoint::module_tensors(*model), o.init_out);
  }
  auto groups = parallel->param_groups();
  std::vector<torch::Tensor> params = groups.decay;
  params.insert(params.end(), groups.no_decay.begin(), groups.no_decay.end());
  tdist::optim::AdamW optimizer(params,
                                tdist::optim::AdamWOptions(1e-3).implementation(
                                    tdist::optim::implementation_from_string(o.optimizer_impl)));

  // Random tokens: throughput does not depend on the text; the same stream on every run.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42 + world.rank);
  double loss_value = 0.0;
  std::chrono::steady_clock::time_point start;
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    if (step == o.warmup) {
      gpt::barrier(world);
      start = std::chrono::steady_clock::now();
    }
    auto tokens =
        torch::randint(0, o.vocab_size, {o.batch_size, o.model.block_size + 1}, gen, torch::kLong);
    using torch::indexing::Slice;
    auto x = tokens.index({Slice(), Slice(0, -1)}).contiguous().to(world.device);
    auto y = tokens.index({Slice(), Slice(1, torch::indexing::None)}).contiguous().to(world.device);
    auto loss = parallel->loss(x, y, /*sync=*/true);
    parallel->backward(loss);
    parallel->clip_grad_norm(1.0);
    optimizer.step();
    optimizer.zero_grad();
    loss_value = loss.item<double>();
  }
  gpt::barrier(world);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto peaks =
      gpt::all_gather_values(world, static_cast<double>(gpt::memory_usage().peak_bytes));
  const auto device_peaks = gpt::all_gather_values(
      world, static_cast<double>(gpt::device_memory_usage(world.device).peak_bytes));
  const auto losses = gpt::all_gather_values(world, loss_value);
  bool ok = true;
  for (double l : losses) ok = ok && std::isfinite(l);
  const double tokens =
      static_cast<double>(o.batch_size) * o.model.block_size * o.steps * world.world_size;
  if (world.is_main()) {
    const std::string device_name = c10::DeviceTypeName(world.device.type(), /*lower_case=*/true);
    const double peak_max = *std::max_element(peaks.begin(), peaks.end());
    const double device_peak_max = *std::max_element(device_peaks.begin(), device_peaks.end());
    const std::string name = "tdist " + to_string(mode) + (o.cpu_offload ? "+offload" : "");
    std::printf("%-20s %-6s %5d %9.2fM %11.0f %9.1f %14.0f %14.0f %10.4f %4s\n", name.c_str(),
                device_name.c_str(), world.world_size, num_parameters / 1e6, tokens / seconds,
                seconds / o.steps * 1e3, peak_max / (1024.0 * 1024.0),
                device_peak_max / (1024.0 * 1024.0), losses[0], ok ? "yes" : "NO");
    std::fflush(stdout);
    if (!o.json_path.empty()) {
      std::ofstream(o.json_path, std::ios::app)
          << nlohmann::json{{"impl", "tdist"},
                            {"mode", to_string(mode)},
                            {"cpu_offload", o.cpu_offload},
                            {"optimizer_impl", o.optimizer_impl},
                            {"flops_per_token", flops_per_token},
                            {"device", device_name},
                            {"parameters", num_parameters},
                            {"world_size", world.world_size},
                            {"tokens_per_s", tokens / seconds},
                            {"step_ms", seconds / o.steps * 1e3},
                            {"peak_rss_bytes", peaks},
                            {"peak_device_bytes", device_peaks},
                            {"final_loss", losses[0]},
                            {"ok", ok}}
                 .dump()
          << "\n";
    }
  }
  gpt::shutdown_world(world);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  bench_common::restart_with_openblas_kernels(argv);
  Options o;
  CLI::App app("Training throughput and peak memory of the GPT model under tdist", "bench_train");
  app.add_option("--mode", o.mode, "single, ddp or fsdp")
      ->check(CLI::IsMember({"single", "ddp", "fsdp"}))
      ->capture_default_str();
  app.add_option("--nproc", o.nproc, "Ranks (spawned locally unless RANK is set)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "Timed steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "Untimed steps first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--threads", o.threads, "Threads per rank (0: cores / ranks)")
      ->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "Sequences per rank per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--n-layer", o.model.n_layer, "Blocks")->capture_default_str();
  app.add_option("--n-head", o.model.n_head, "Heads")->capture_default_str();
  app.add_option("--n-embd", o.model.n_embd, "Width")->capture_default_str();
  app.add_option("--block-size", o.model.block_size, "Context")->capture_default_str();
  app.add_option("--json", o.json_path, "Append the result as a JSON line to FILE");
  app.add_option("--device", o.device, "cpu, cuda or auto (as gpt --device)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  app.add_flag("--cpu-offload", o.cpu_offload, "fsdp: shards and AdamW state in host memory");
  app.add_option("--optimizer-impl", o.optimizer_impl,
                 "AdamW: fused, foreach, for-loop or default (both sides run the same)")
      ->capture_default_str();
  app.add_option("--init-out", o.init_out,
                 "Write the initial parameters to FILE (.pt) for the PyTorch side to start from");
  app.add_flag_callback(
      "--header",
      [] {
        std::printf("%-20s %-6s %5s %10s %11s %9s %14s %14s %10s %4s\n", "impl", "device", "ranks",
                    "params", "tokens/s", "step_ms", "peak_rss_MiB", "peak_dev_MiB", "loss", "ok");
        std::exit(0);
      },
      "Print the table header and exit");
  CLI11_PARSE(app, argc, argv);
  try {
    o.model.validate();
    if (!gpt::adopt_launch_environment() && o.nproc > 1) {
      return gpt::spawn_local_ranks(o.nproc, std::vector<std::string>(argv, argv + argc));
    }
    return run_rank(o);
  } catch (const std::exception& e) {
    std::cerr << "bench_train: error: " << e.what() << "\n";
    return 1;
  }
}

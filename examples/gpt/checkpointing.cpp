#include "gpt/checkpointing.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "tdist/detail/util/torch_compat.h"
#include "tdist/error.h"
#include "tdist/fsdp/deferred_init.h"
#include "tdist/models/pretrained.h"
#ifdef TDIST_GPT_WITH_CHECKPOINT
#include "tdist/checkpoint/checkpoint_manager.h"
#include "tdist/checkpoint/module_state.h"
#endif

namespace gpt {
namespace fs = std::filesystem;
namespace {

#ifndef TDIST_GPT_WITH_CHECKPOINT  // the torch::save fallback names its own step folders
std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}
#endif

// Complete step directories, oldest first. A directory is complete when its marker file
// exists: metadata.json (tdist::checkpoint commits it last) or meta.json (our fallback,
// written last before the rename).
std::vector<std::pair<int64_t, std::string>> complete_steps(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return steps;
  static const std::regex pattern("step_([0-9]+)");
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !std::regex_match(name, m, pattern)) continue;
    if (!fs::exists(entry.path() / "metadata.json") && !fs::exists(entry.path() / "meta.json"))
      continue;
    steps.emplace_back(std::stoll(m[1].str()), entry.path().string());
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace

#ifdef TDIST_GPT_WITH_CHECKPOINT
struct Checkpointer::Background {
  explicit Background(const std::string& root)
      : manager(root, tdist::checkpoint::CheckpointManagerOptions().save_options(
                          tdist::checkpoint::SaveOptions().overwrite(true))) {}
  tdist::checkpoint::CheckpointManager manager;
};
#else
struct Checkpointer::Background {};
#endif

Checkpointer::Checkpointer(std::string run_dir, World world, bool async)
    : root_((fs::path(run_dir) / "checkpoints").string()), world_(world) {
#ifdef TDIST_GPT_WITH_CHECKPOINT
  if (async) background_ = std::make_unique<Background>(root_);
#else
  (void)async;
#endif
}

Checkpointer::~Checkpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt: the last background checkpoint failed: %s\n", e.what());
  }
}

void Checkpointer::wait() {
#ifdef TDIST_GPT_WITH_CHECKPOINT
  if (background_) background_->manager.wait();
#endif
}

std::string Checkpointer::backend_name() {
#ifdef TDIST_GPT_WITH_CHECKPOINT
  return "tdist::checkpoint";
#else
  return "torch::save (rank 0)";
#endif
}

std::string config_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "config.json").string();
}

std::optional<std::string> checkpoint_at_step(const std::string& run_dir, int64_t step) {
  for (const auto& [s, dir] : complete_steps((fs::path(run_dir) / "checkpoints").string())) {
    if (s == step) return dir;
  }
  return std::nullopt;
}

std::optional<std::string> newest_checkpoint(const std::string& run_dir) {
  auto steps = complete_steps((fs::path(run_dir) / "checkpoints").string());
  if (steps.empty()) return std::nullopt;
  return steps.back().second;
}

#ifdef TDIST_GPT_WITH_CHECKPOINT

namespace {

// Model and AdamW state as named slices, aliasing the live tensors (a load writes in place).
// Names as tdist::checkpoint::save_module writes them ("model.<fqn>",
// "optim.state.<fqn>.exp_avg", ...), so `generate` reads any run's checkpoint with
// load_module. AdamW state absent so far (no step taken) is created as zeros.
struct TrainingState {
  tdist::ShardedStateDict tensors;
  std::vector<std::pair<torch::optim::AdamWParamState*, torch::Tensor>> steps;
};

TrainingState training_state(Parallel& parallel, torch::optim::AdamW& optimizer) {
  TrainingState state;
  auto& opt_state = optimizer.state();
  for (auto& [name, slice] : parallel.parameter_slices()) {
    state.tensors[tdist::checkpoint::kModelPrefix + name] = slice;
    const auto& param = slice.local;
    auto key = tdist::util::optimizer_state_key(param);
    auto it = opt_state.find(key);
    if (it == opt_state.end()) {
      auto fresh = std::make_unique<torch::optim::AdamWParamState>();
      fresh->step(0);
      fresh->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Preserve));
      fresh->exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
      opt_state[key] = std::move(fresh);
      it = opt_state.find(key);
    }
    auto& adam = static_cast<torch::optim::AdamWParamState&>(*it->second);
    const std::string prefix = std::string(tdist::checkpoint::kOptimPrefix) + name + ".";
    state.tensors[prefix + "exp_avg"] =
        tdist::ShardedTensor{adam.exp_avg(), slice.global_shape, slice.offsets};
    state.tensors[prefix + "exp_avg_sq"] =
        tdist::ShardedTensor{adam.exp_avg_sq(), slice.global_shape, slice.offsets};
    auto step = torch::tensor(adam.step(), torch::kLong).reshape({});
    state.tensors[prefix + "step"] = tdist::ShardedTensor::whole(step);
    state.steps.emplace_back(&adam, step);
  }
  return state;
}

}  // namespace

void Checkpointer::save(int64_t step, int64_t data_position, Parallel& parallel,
                        torch::optim::AdamW& optimizer) {
  tdist::checkpoint::ExtraState extra;
  extra.step = step;
  extra.data_position = data_position;
  torch::NoGradGuard no_grad;
  if (background_) {
    background_->manager.async_save(step, training_state(parallel, optimizer).tensors, extra);
    return;
  }
  tdist::checkpoint::CheckpointManager manager(
      root_, tdist::checkpoint::CheckpointManagerOptions().save_options(
                 tdist::checkpoint::SaveOptions().overwrite(true)));
  manager.save(step, training_state(parallel, optimizer).tensors, extra);
}

std::optional<Checkpointer::Resumed> Checkpointer::load_latest(Parallel& parallel,
                                                               torch::optim::AdamW& optimizer) {
  wait();
  tdist::checkpoint::CheckpointManager manager(root_);
  torch::NoGradGuard no_grad;
  auto state = training_state(parallel, optimizer);
  auto result = manager.load_latest(state.tensors);
  if (!result) return std::nullopt;
  for (auto& [adam, step] : state.steps) adam->step(step.item<int64_t>());
  return Resumed{result->extra.step, result->extra.data_position};
}

#else  // torch::save fallback: the model is whole on every rank, rank 0 writes it.

namespace {

// AdamW state per parameter, by position in named_parameters(): torch::save/load of the
// optimizer keys its state by the old process's tensor addresses, so a resumed run would
// diverge after its first step.
void save_adamw_state(Parallel& parallel, torch::optim::AdamW& optimizer, const std::string& path) {
  torch::serialize::OutputArchive archive;
  int64_t i = 0;
  for (const auto& item : parallel.model()->named_parameters()) {
    const std::string key = "p" + std::to_string(i++);
    auto it = optimizer.state().find(tdist::util::optimizer_state_key(item.value()));
    if (it == optimizer.state().end()) continue;
    auto& adam = static_cast<torch::optim::AdamWParamState&>(*it->second);
    archive.write(key + "_exp_avg", adam.exp_avg());
    archive.write(key + "_exp_avg_sq", adam.exp_avg_sq());
    archive.write(key + "_step", torch::tensor(adam.step(), torch::kLong));
  }
  archive.save_to(path);
}

void load_adamw_state(Parallel& parallel, torch::optim::AdamW& optimizer, const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  int64_t i = 0;
  for (const auto& item : parallel.model()->named_parameters()) {
    const std::string key = "p" + std::to_string(i++);
    torch::Tensor exp_avg, exp_avg_sq, step;
    if (!archive.try_read(key + "_exp_avg", exp_avg)) continue;
    archive.read(key + "_exp_avg_sq", exp_avg_sq);
    archive.read(key + "_step", step);
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(step.item<int64_t>());
    state->exp_avg(exp_avg.clone());
    state->exp_avg_sq(exp_avg_sq.clone());
    optimizer.state()[tdist::util::optimizer_state_key(item.value())] = std::move(state);
  }
}

}  // namespace

void Checkpointer::save(int64_t step, int64_t data_position, Parallel& parallel,
                        torch::optim::AdamW& optimizer) {
  if (!parallel.replicated()) {
    TDIST_THROW(tdist::CheckpointError,
                "checkpoint: this gpt was built without tdist::checkpoint, which sharded (fsdp) "
                "runs need; use --checkpoint-interval 0 or --mode ddp");
  }
  if (world_.is_main()) {
    const fs::path final_dir = fs::path(root_) / step_dir_name(step);
    const fs::path tmp_dir = fs::path(root_) / ("." + step_dir_name(step) + ".partial");
    fs::remove_all(tmp_dir);
    fs::create_directories(tmp_dir);
    {
      torch::serialize::OutputArchive archive;
      parallel.model()->save(archive);
      archive.save_to((tmp_dir / "model.pt").string());
    }
    save_adamw_state(parallel, optimizer, (tmp_dir / "optimizer.pt").string());
    std::ofstream((tmp_dir / "meta.json").string())
        << nlohmann::json{{"step", step}, {"data_position", data_position}}.dump() << "\n";
    fs::remove_all(final_dir);
    fs::rename(tmp_dir, final_dir);
  }
  barrier(world_);
}

std::optional<Checkpointer::Resumed> Checkpointer::load_latest(Parallel& parallel,
                                                               torch::optim::AdamW& optimizer) {
  auto steps = complete_steps(root_);
  if (steps.empty()) return std::nullopt;
  const fs::path dir = steps.back().second;
  torch::serialize::InputArchive archive;
  archive.load_from((dir / "model.pt").string());
  parallel.model()->load(archive);
  load_adamw_state(parallel, optimizer, (dir / "optimizer.pt").string());
  std::ifstream meta((dir / "meta.json").string());
  const auto json = nlohmann::json::parse(meta, nullptr, /*allow_exceptions=*/false);
  return Resumed{steps.back().first,
                 json.is_object() ? json.value("data_position", int64_t{0}) : int64_t{0}};
}

#endif

std::string model_files_dir(const std::string& run_dir) {
  return (fs::path(run_dir) / "model").string();
}

Model load_model_from_run(const std::string& run_dir, int64_t step) {
  const fs::path config_file = fs::path(model_files_dir(run_dir)) / "config.json";
  if (!fs::is_regular_file(config_file)) {
    TDIST_THROW(tdist::CheckpointError, "no " + config_file.string() +
                                            "; pass --run-dir of a training run (e.g. runs/gpt)");
  }
  auto config = tdist::models::ModelConfig::load(model_files_dir(run_dir));
  Model model;
  {
    tdist::fsdp::MetaDeviceGuard meta;
    model = tdist::models::build_model(config);
  }
  tdist::fsdp::materialize(
      model, tdist::fsdp::MaterializeOptions().init_fn(tdist::models::init_weights_fn(config)));
  auto dir = step >= 0 ? checkpoint_at_step(run_dir, step) : newest_checkpoint(run_dir);
  if (!dir && step >= 0) {
    TDIST_THROW(tdist::CheckpointError,
                run_dir + "/checkpoints has no complete checkpoint of step " +
                    std::to_string(step) + "; leave --step out for the newest one");
  }
  if (!dir) {
    TDIST_THROW(tdist::CheckpointError, run_dir +
                                            "/checkpoints has no complete checkpoint; train with "
                                            "--checkpoint-interval > 0 first");
  }
#ifdef TDIST_GPT_WITH_CHECKPOINT
  tdist::checkpoint::load_module(*model, nullptr, *dir);
#else
  torch::serialize::InputArchive archive;
  archive.load_from((fs::path(*dir) / "model.pt").string());
  model->load(archive);
#endif
  return model;
}

}  // namespace gpt

#include "gpt/export.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "gpt/checkpointing.h"
#include "gpt/cli.h"
#include "tdist/error.h"
#ifdef TDIST_GPT_WITH_CHECKPOINT
#include "tdist/checkpoint/interchange.h"
#include "tdist/checkpoint/module_state.h"
#endif

namespace gpt {

namespace fs = std::filesystem;

std::vector<std::string> export_run(const ExportConfig& config) {
#ifdef TDIST_GPT_WITH_CHECKPOINT
  TDIST_CHECK_ARG(
      config.format == "pt" || config.format == "safetensors" || config.format == "dcp",
      "gpt export: --format must be pt, safetensors or dcp, not '" + config.format + "'");
  TDIST_CHECK_ARG(!config.out.empty(), "gpt export: --out names the file to write");
  namespace ckpt = tdist::checkpoint;
  GPT model = load_model_from_run(config.run_dir, config.step);
  const fs::path out(config.out);
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  if (config.format == "dcp") {
    // A directory with the model's state as "model.<fqn>", like dcp.save({"model": sd}).
    ckpt::save_module(*model, nullptr, {}, out.string(),
                      ckpt::SaveOptions()
                          .format(ckpt::CheckpointFormat::kDcp)
                          .overwrite(true)
                          .coordinator(std::make_shared<ckpt::LocalCoordinator>()));
  } else if (config.format == "pt") {
    ckpt::export_torch_file(ckpt::module_tensors(*model), out.string());
  } else {
    ckpt::save_safetensors(ckpt::module_tensors(*model), out.string(), {{"format", "pt"}});
  }
  const auto& m = model->config();
  const nlohmann::json shape = {{"vocab_size", m.vocab_size}, {"block_size", m.block_size},
                                {"n_layer", m.n_layer},       {"n_head", m.n_head},
                                {"n_embd", m.n_embd},         {"tie_weights", m.tie_weights}};
  fs::path config_file = out;
  config_file.replace_extension(".json");  // a dcp directory's too: beside it, not in it
  std::ofstream(config_file) << shape.dump(2) << "\n";
  return {out.string(), config_file.string()};
#else
  (void)config;
  TDIST_THROW(tdist::InvalidArgument,
              "gpt export: this build has no tdist_checkpoint (TDIST_GPT_WITH_CHECKPOINT=OFF)");
#endif
}

int run_export_command(const ExportConfig& config) {
  try {
    const auto files = export_run(config);
    std::cout << "wrote " << files[0] << " and " << files[1]
              << "\nload in Python: examples/gpt/python/gpt_export.py (README, \"Your model in "
                 "Python\")\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gpt export: error: " << user_message(e) << "\n";
    return 1;
  }
}

}  // namespace gpt

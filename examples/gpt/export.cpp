#include "gpt/export.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "gpt/checkpointing.h"
#include "gpt/cli.h"
#include "tdist/error.h"
#include "tdist/models/pretrained.h"
#ifdef TDIST_GPT_WITH_CHECKPOINT
#include "tdist/checkpoint/interchange.h"
#include "tdist/checkpoint/module_state.h"
#endif

namespace gpt {

namespace fs = std::filesystem;

namespace {

c10::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32") return c10::kFloat;
  if (name == "bfloat16") return c10::kBFloat16;
  if (name == "float16") return c10::kHalf;
  TDIST_THROW(tdist::InvalidArgument,
              "gpt export: --dtype must be float32, bfloat16 or float16, not '" + name + "'");
}

}  // namespace

std::vector<std::string> export_run(const ExportConfig& config) {
  TDIST_CHECK_ARG(
      config.format == "hf" || config.format == "pt" || config.format == "safetensors" ||
          config.format == "dcp",
      "gpt export: --format must be hf, pt, safetensors or dcp, not '" + config.format + "'");
  TDIST_CHECK_ARG(!config.out.empty(), "gpt export: --out names the folder or file to write");
  const c10::ScalarType dtype = parse_dtype(config.dtype);
  Model model = load_model_from_run(config.run_dir, config.step);
  const fs::path out(config.out);
  if (config.format == "hf") {
    std::vector<std::string> files = tdist::models::save_pretrained(
        *model, out.string(),
        tdist::models::SaveOptions().dtype(dtype).files_from(model_files_dir(config.run_dir)));
    for (auto& f : files) f = (out / f).string();
    return files;
  }
#ifdef TDIST_GPT_WITH_CHECKPOINT
  namespace ckpt = tdist::checkpoint;
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  model->to(dtype);
  if (config.format == "dcp") {
    // A directory with the model's state as "model.<fqn>", like dcp.save({"model": sd}).
    ckpt::save_module(*model, nullptr, {}, out.string(),
                      ckpt::SaveOptions()
                          .format(ckpt::CheckpointFormat::kDCP)
                          .overwrite(true)
                          .coordinator(std::make_shared<ckpt::LocalCoordinator>()));
  } else if (config.format == "pt") {
    ckpt::export_torch_file(ckpt::module_tensors(*model), out.string());
  } else {
    ckpt::save_safetensors(ckpt::module_tensors(*model), out.string(), {{"format", "pt"}});
  }
  fs::path config_file = out;
  config_file.replace_extension(".json");  // a dcp directory's too: beside it, not in it
  std::ofstream(config_file) << model->config().to_json() << "\n";
  return {out.string(), config_file.string()};
#else
  TDIST_THROW(tdist::InvalidArgument, "gpt export --format " + config.format +
                                          ": this build has no tdist_checkpoint; use --format hf");
#endif
}

int run_export_command(const ExportConfig& config) {
  try {
    const auto files = export_run(config);
    std::cout << "wrote";
    for (const auto& f : files) std::cout << " " << f;
    std::cout << "\nload in Python: examples/gpt/python/hf_generate.py " << config.out
              << " (or transformers' AutoModelForCausalLM.from_pretrained for --format hf)\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gpt export: error: " << user_message(e) << "\n";
    return 1;
  }
}

}  // namespace gpt

// gpt: train a small GPT on the bundled corpus (README command 1), or sample from a run.
//   gpt                         train with the defaults (2 ranks, about 2-3 minutes on 2 cores)
//   gpt --help                  every flag
//   gpt generate --run-dir runs/gpt --prompt "In the beginning"
//   gpt export --run-dir runs/gpt --format safetensors --out runs/gpt/export/gpt.safetensors

#include <iostream>
#include <string>
#include <vector>

#include "gpt/cli.h"
#include "gpt/export.h"
#include "gpt/trainer.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  gpt::Command command;
  if (int code = gpt::parse_command_line(args, command, std::cout, std::cerr); code >= 0) {
    return code;
  }
  if (command.kind == gpt::Command::Kind::kGenerate) {
    return gpt::run_generate_command(command.generate);
  }
  if (command.kind == gpt::Command::Kind::kExport) return gpt::run_export_command(command.exported);
  return gpt::run_train_command(command.train, std::vector<std::string>(argv, argv + argc));
}

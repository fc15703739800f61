#pragma once

// `gpt export`: a training run's weights as one file Python reads (torch.load or
// safetensors), named as PyTorch names the Python twin's parameters
// (examples/gpt/python/gpt_export.py), and the model's shape beside it as JSON.

#include <string>
#include <vector>

#include "gpt/config.h"

namespace gpt {

/// Writes the weights of `config.run_dir`'s checkpoint to config.out and its model config to
/// the same path with the extension .json; returns the two paths.
std::vector<std::string> export_run(const ExportConfig& config);

/// export_run for the command line: prints what it wrote (or the error); the exit code.
int run_export_command(const ExportConfig& config);

}  // namespace gpt

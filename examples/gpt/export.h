#pragma once

// `gpt export`: a training run's model for the Python side. --format hf (the default) writes
// a Hugging Face model folder (config.json, model.safetensors, the tokenizer's files,
// generation_config.json) that transformers' from_pretrained loads; pt, safetensors and dcp
// write the state dict (transformers' parameter names) as one torch.load / safetensors file
// or a torch.distributed.checkpoint directory, with the config.json beside it (.json).
// examples/gpt/python/hf_generate.py loads any of them.

#include <string>
#include <vector>

#include "gpt/config.h"

namespace gpt {

/// Writes `config.run_dir`'s checkpoint as config.format asks; returns the paths written.
std::vector<std::string> export_run(const ExportConfig& config);

/// export_run for the command line: prints what it wrote (or the error); the exit code.
int run_export_command(const ExportConfig& config);

}  // namespace gpt

#pragma once

// Command line of the gpt program:
//   gpt [train] [flags]                       pretrain, or fine-tune with --from (the default)
//   gpt generate --run-dir DIR | --model DIR  continue a prompt (KV cache)
//   gpt export --run-dir DIR --out DIR        a Hugging Face model folder (or --format
//                                             pt|safetensors|dcp: weights for Python)
// Flags may also come from --config FILE: JSON ({"steps": 300, "n_layer": 4}) or key=value
// lines (steps = 300); names are the long flag names, '_' and '-' both accepted. Flags on
// the command line override the file.

#include <exception>
#include <iosfwd>
#include <string>
#include <vector>

#include "gpt/config.h"

namespace gpt {

struct Command {
  enum class Kind { kTrain, kGenerate, kExport } kind = Kind::kTrain;
  TrainConfig train;
  GenerateConfig generate;
  ExportConfig exported;
};

/// e.what() without the source stamp for tdist::InvalidArgument (a value the user must fix).
std::string user_message(const std::exception& e);

/// Parses args (without the program name). Returns -1 when the program should go on with
/// `command`; otherwise the exit code, after printing help (0) or a clear error (2) to
/// out / err.
int parse_command_line(const std::vector<std::string>& args, Command& command, std::ostream& out,
                       std::ostream& err);

}  // namespace gpt

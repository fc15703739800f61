// libFuzzer target for the trainer's --config FILE (examples/gpt/cli.cpp: JSON or key=value
// lines, then every flag's own check). Property: any file ends in a configuration or in a
// usage error (exit code 2 with a message), never an exception or a crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "gpt/cli.h"

namespace {

const std::string& input_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
           "/tdist_train_config_fuzz_" + std::to_string(::getpid()) + ".json";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FILE* f = std::fopen(input_path().c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  gpt::Command command;
  std::ostringstream out, err;
  const int code = gpt::parse_command_line({"train", "--config", input_path()}, command, out, err);
  if (code == 2 && err.str().empty()) std::abort();  // a usage error says what is wrong
  if (code != -1 && code != 0 && code != 2) std::abort();
  return 0;
}

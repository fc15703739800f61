// libFuzzer target for config.json as from_pretrained reads it (tdist::models::ModelConfig,
// src/models/config.cpp). Properties: any text either parses or raises tdist::Error
// (InvalidArgument naming the field); a config that parses and validates has a parameter
// count that does not overflow (UBSan) and writes a config.json that parses back to the same
// model shape.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tdist/error.h"
#include "tdist/models/config.h"

using tdist::models::ModelConfig;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ModelConfig config;
  try {
    config = ModelConfig::from_json(text, "fuzz input");
    config.validate();
  } catch (const tdist::Error&) {
    return 0;
  }
  (void)config.num_parameters();
  ModelConfig again;
  try {
    again = ModelConfig::from_json(config.to_json(), "written back");
  } catch (const tdist::Error& e) {
    std::abort();  // what tdist writes, it must read
  }
  if (again.family != config.family || again.hidden_size != config.hidden_size ||
      again.num_hidden_layers != config.num_hidden_layers ||
      again.vocab_size != config.vocab_size || again.head_dim != config.head_dim ||
      again.num_key_value_heads != config.num_key_value_heads ||
      again.intermediate_size != config.intermediate_size) {
    std::abort();
  }
  return 0;
}

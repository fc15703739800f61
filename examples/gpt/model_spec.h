#pragma once

// Which model the trainer trains: a Hugging Face folder to fine-tune (--from), a config.json
// of any family and size (--model-config), or a family and its shape from flags. All three
// end as a tdist::models::ModelConfig, parsed by the same code that reads the Hub's
// config.json, so a shape flag that a family cannot take is refused by its field name.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tdist/models/config.h"

namespace gpt {

struct ModelSpec {
  std::string from;              ///< fine-tune: a model folder (config.json + safetensors)
  std::string config_file;       ///< pretrain: a config.json (any supported family and size)
  std::string family = "llama";  ///< pretrain from flags: llama, mistral, qwen2 or gpt2
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_kv_head = 0;      ///< grouped-query attention's KV heads; 0: n_head
  int64_t n_embd = 128;       ///< hidden size
  int64_t intermediate = 0;   ///< MLP width; 0: the family's (GPT-2 4x, others 8/3x rounded)
  int64_t block_size = 128;   ///< training sequence length (tokens)
  int64_t max_positions = 0;  ///< max_position_embeddings; 0: block_size
  double dropout = 0.0;       ///< GPT-2's dropouts, the others' attention dropout
  bool tie_weights = true;
  double rope_theta = 10000.0;

  /// Checks the flags that do not depend on the tokenizer.
  void validate() const;
  /// Throws InvalidArgument unless `from` is empty or a folder with a config.json.
  void check_from_folder() const;
  /// The model's config: from `from`'s or config_file's config.json, else from the flags
  /// with `vocab_size` and the token ids. Throws InvalidArgument naming the flag or field.
  tdist::models::ModelConfig resolve(int64_t vocab_size, std::optional<int64_t> bos,
                                     std::optional<int64_t> eos) const;
  /// The flags as config.json of the family (transformers' field names).
  nlohmann::json to_hf_json(int64_t vocab_size, std::optional<int64_t> bos,
                            std::optional<int64_t> eos) const;
  std::string describe() const;
};

nlohmann::json to_json(const ModelSpec& spec);

}  // namespace gpt

#pragma once

// The configuration of a Hugging Face decoder model (its config.json), for the families
// tdist implements: Llama (2, 3, 3.1+), Mistral, Qwen2 and GPT-2. Parsing follows what
// `transformers` 5.x's configuration classes do with the same file (defaults, legacy
// spellings such as rope_scaling / rope_theta and GPT-2's n_embd, Qwen2's layer_types).
//
// Note [Every field is honoured or refused]
// A field that changes the computation is either implemented or refused with an error
// naming it; it is never ignored. Fields known not to change the computation (token ids,
// use_cache, initializer_range, ...) are kept for writing back, and so are fields
// transformers' own class for that family ignores. Any other field is refused, since a
// model loaded with it silently dropped would compute something else than its authors'.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

namespace tdist::models {

enum class ModelFamily { kLlama, kMistral, kQwen2, kGPT2 };

/// "llama", "mistral", "qwen2", "gpt2" (config.json's model_type).
std::string model_type_of(ModelFamily family);
/// "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "GPT2LMHeadModel".
std::string architecture_of(ModelFamily family);

/// Rotary position embedding (Llama, Mistral, Qwen2): transformers' rope_parameters.
struct RopeConfig {
  std::string type = "default";  ///< default, linear, dynamic or llama3
  double theta = 10000.0;
  double factor = 1.0;                           ///< linear, dynamic, llama3
  double low_freq_factor = 1.0;                  ///< llama3
  double high_freq_factor = 4.0;                 ///< llama3
  int64_t original_max_position_embeddings = 0;  ///< llama3
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 128;
  int64_t max_position_embeddings = 2048;
  /// silu, gelu, gelu_new, gelu_pytorch_tanh, relu.
  std::string hidden_act = "silu";
  /// RMSNorm's epsilon (GPT-2: LayerNorm's layer_norm_epsilon).
  double norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  ///< q/k/v projections (Llama attention_bias, Qwen2 always)
  bool o_bias = false;    ///< output projection (Llama attention_bias)
  bool mlp_bias = false;
  RopeConfig rope;
  /// Per layer: the sliding attention window (a query sees the last `window` positions,
  /// itself included), 0 for full causal attention.
  std::vector<int64_t> sliding_windows;
  double attention_dropout = 0.0;                ///< GPT-2: attn_pdrop
  double embedding_dropout = 0.0;                ///< GPT-2: embd_pdrop
  double residual_dropout = 0.0;                 ///< GPT-2: resid_pdrop
  bool scale_attn_weights = true;                ///< GPT-2: divide scores by sqrt(head_dim)
  bool scale_attn_by_inverse_layer_idx = false;  ///< GPT-2: and by layer index + 1
  /// Standard deviation of transformers' weight initialisation (init_weights_fn).
  double initializer_range = 0.02;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> pad_token_id;
  /// The dtype the weights were saved in (config.json's dtype / torch_dtype).
  c10::ScalarType dtype = c10::kFloat;
  /// config.json as it was read ("" when built in code): fields tdist keeps but does not
  /// use are written back from it.
  std::string source_json;

  /// Parses config.json's text; `where` names it in errors. Throws InvalidArgument naming
  /// the field for an unknown model_type / architectures, an unsupported value or a field
  /// tdist does not know (Note [Every field is honoured or refused]).
  static ModelConfig from_json(const std::string& text, const std::string& where = "config.json");
  /// Reads `<dir>/config.json`.
  static ModelConfig load(const std::string& dir);
  /// config.json for this model, loadable by transformers (4.x and 5.x spellings).
  std::string to_json() const;
  /// Throws InvalidArgument naming the field that makes the model impossible to build.
  void validate() const;
  /// Parameters of a model built from this config (tied embeddings counted once).
  int64_t num_parameters() const;
};

}  // namespace tdist::models

#include "tdist/models/config.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tdist/error.h"

namespace tdist::models {
namespace {

using nlohmann::json;

struct FamilyInfo {
  ModelFamily family;
  const char* model_type;
  const char* architecture;
};
constexpr FamilyInfo kFamilies[] = {
    {ModelFamily::kLlama, "llama", "LlamaForCausalLM"},
    {ModelFamily::kMistral, "mistral", "MistralForCausalLM"},
    {ModelFamily::kQwen2, "qwen2", "Qwen2ForCausalLM"},
    {ModelFamily::kGPT2, "gpt2", "GPT2LMHeadModel"},
};

const FamilyInfo& info(ModelFamily family) {
  for (const auto& f : kFamilies) {
    if (f.family == family) return f;
  }
  TDIST_THROW(InvalidArgument, "models: unknown model family");
}

// Fields that never change what the model computes; kept, not used.
const std::set<std::string>& harmless_fields() {
  static const std::set<std::string> fields = {"architectures",
                                               "model_type",
                                               "transformers_version",
                                               "use_cache",
                                               "initializer_range",
                                               "bos_token_id",
                                               "eos_token_id",
                                               "pad_token_id",
                                               "dtype",
                                               "torch_dtype",
                                               "id2label",
                                               "label2id",
                                               "output_attentions",
                                               "output_hidden_states",
                                               "return_dict",
                                               "problem_type",
                                               "tokenizer_class",
                                               "prefix",
                                               "sep_token_id",
                                               "decoder_start_token_id",
                                               "task_specific_params",
                                               "finetuning_task",
                                               "chunk_size_feed_forward",
                                               "is_decoder",
                                               "is_encoder_decoder",
                                               "tie_encoder_decoder",
                                               "cross_attention_hidden_size",
                                               "add_cross_attention",
                                               "pruned_heads",
                                               "torchscript",
                                               "use_bfloat16",
                                               "tf_legacy_loss",
                                               "max_length",
                                               "min_length",
                                               "do_sample",
                                               "early_stopping",
                                               "num_beams",
                                               "num_beam_groups",
                                               "diversity_penalty",
                                               "temperature",
                                               "top_k",
                                               "top_p",
                                               "typical_p",
                                               "repetition_penalty",
                                               "length_penalty",
                                               "no_repeat_ngram_size",
                                               "encoder_no_repeat_ngram_size",
                                               "bad_words_ids",
                                               "num_return_sequences",
                                               "output_scores",
                                               "return_dict_in_generate",
                                               "forced_bos_token_id",
                                               "forced_eos_token_id",
                                               "remove_invalid_values",
                                               "exponential_decay_length_penalty",
                                               "suppress_tokens",
                                               "begin_suppress_tokens",
                                               "num_labels",
                                               "label_smoothing"};
  return fields;
}

// Fields transformers' class for the family reads but does not use in its computation.
const std::set<std::string>& ignored_by_transformers(ModelFamily family) {
  static const std::set<std::string> llama = {"pretraining_tp"};
  static const std::set<std::string> mistral = {"attention_bias", "mlp_bias", "layer_types"};
  static const std::set<std::string> qwen2 = {"attention_bias", "mlp_bias"};
  static const std::set<std::string> gpt2 = {"n_ctx",
                                             "summary_type",
                                             "summary_use_proj",
                                             "summary_activation",
                                             "summary_proj_to_labels",
                                             "summary_first_dropout",
                                             "reorder_and_upcast_attn"};
  switch (family) {
    case ModelFamily::kLlama:
      return llama;
    case ModelFamily::kMistral:
      return mistral;
    case ModelFamily::kQwen2:
      return qwen2;
    case ModelFamily::kGPT2:
      return gpt2;
  }
  return llama;
}

// Reads config.json's fields, remembering which were used so the rest can be checked.
class Fields {
 public:
  Fields(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  [[noreturn]] void refuse(const std::string& field, const std::string& why) const {
    TDIST_THROW(InvalidArgument, "models: " + where_ + ": field '" + field + "' " + why);
  }
  bool has(const std::string& key) {
    used_.insert(key);
    return j_.contains(key) && !j_[key].is_null();
  }
  int64_t integer(const std::string& key, std::optional<int64_t> fallback = std::nullopt) {
    if (!has(key)) {
      if (fallback) return *fallback;
      refuse(key, "is missing, and the model cannot be built without it");
    }
    if (!j_[key].is_number_integer()) refuse(key, "must be an integer, got " + j_[key].dump());
    return j_[key].get<int64_t>();
  }
  double number(const std::string& key, double fallback) {
    if (!has(key)) return fallback;
    if (!j_[key].is_number()) refuse(key, "must be a number, got " + j_[key].dump());
    return j_[key].get<double>();
  }
  bool boolean(const std::string& key, bool fallback) {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) refuse(key, "must be true or false, got " + j_[key].dump());
    return j_[key].get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) {
    if (!has(key)) return fallback;
    if (!j_[key].is_string()) refuse(key, "must be a string, got " + j_[key].dump());
    return j_[key].get<std::string>();
  }
  const json& raw(const std::string& key) {
    used_.insert(key);
    return j_[key];
  }
  void check_all_known(ModelFamily family) const {
    const auto& ignored = ignored_by_transformers(family);
    for (const auto& [key, value] : j_.items()) {
      if (used_.count(key) || harmless_fields().count(key) || ignored.count(key)) continue;
      if (!key.empty() && key[0] == '_') continue;  // _name_or_path, _attn_implementation...
      refuse(key, std::string("is not known to tdist's ") + info(family).model_type +
                      " model, which therefore cannot tell whether it changes the computation; "
                      "remove it from config.json if it does not (quantization_config and "
                      "auto_map, for example, do: quantized and custom-code models are not "
                      "supported)");
    }
  }

 private:
  const json& j_;
  std::string where_;
  std::set<std::string> used_;
};

ModelFamily family_from(Fields& f, const json& j) {
  const std::string type = f.string("model_type", "");
  const FamilyInfo* found = nullptr;
  for (const auto& fam : kFamilies) {
    if (type == fam.model_type) found = &fam;
  }
  if (found == nullptr) {
    f.refuse("model_type",
             "is '" + type + "', not a family tdist implements (llama, mistral, qwen2, gpt2)");
  }
  if (f.has("architectures")) {
    const json& arch = j["architectures"];
    if (!arch.is_array() || arch.size() != 1 || !arch[0].is_string() ||
        arch[0].get<std::string>() != found->architecture) {
      f.refuse("architectures", "is " + arch.dump() + "; tdist implements " +
                                    std::string(found->architecture) + " for model_type '" + type +
                                    "'");
    }
  }
  return found->family;
}

c10::ScalarType dtype_from(Fields& f, const json& j) {
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const std::string name = j[key].is_string() ? j[key].get<std::string>() : "";
    if (name == "float32" || name == "float") return c10::kFloat;
    if (name == "bfloat16") return c10::kBFloat16;
    if (name == "float16" || name == "half") return c10::kHalf;
    f.refuse(key, "is " + j[key].dump() + "; tdist loads float32, bfloat16 and float16 models");
  }
  return c10::kFloat;
}

std::vector<int64_t> token_ids(Fields& f, const json& j, const std::string& key) {
  if (!j.contains(key) || j[key].is_null()) return {};
  if (j[key].is_number_integer()) return {j[key].get<int64_t>()};
  if (j[key].is_array()) {
    std::vector<int64_t> ids;
    for (const auto& v : j[key]) {
      if (!v.is_number_integer()) f.refuse(key, "must hold token ids, got " + j[key].dump());
      ids.push_back(v.get<int64_t>());
    }
    return ids;
  }
  f.refuse(key, "must be a token id or a list of them, got " + j[key].dump());
}

void parse_rope(Fields& f, ModelConfig& c) {
  const double top_theta = f.number("rope_theta", 10000.0);
  json params = json::object();
  std::string field = "rope_parameters";
  const bool has_parameters = f.has("rope_parameters");
  if (f.has("rope_scaling")) {  // transformers 4.x, and 5.x prefers it when present
    params = f.raw("rope_scaling");
    field = "rope_scaling";
  } else if (has_parameters) {
    params = f.raw("rope_parameters");
  }
  if (!params.is_object()) f.refuse(field, "must be an object, got " + params.dump());
  if (f.has("partial_rotary_factor") && f.number("partial_rotary_factor", 1.0) != 1.0) {
    f.refuse("partial_rotary_factor", "is not 1; tdist rotates the whole head");
  }
  static const std::set<std::string> known = {"rope_type",
                                              "type",
                                              "rope_theta",
                                              "factor",
                                              "low_freq_factor",
                                              "high_freq_factor",
                                              "original_max_position_embeddings"};
  for (const auto& [key, value] : params.items()) {
    if (!known.count(key) && !(key == "partial_rotary_factor" && value == 1.0)) {
      f.refuse(field + "." + key, "is not a rope parameter tdist implements");
    }
  }
  auto get = [&](const char* key, double fallback) {
    if (!params.contains(key) || params[key].is_null()) return fallback;
    if (!params[key].is_number()) f.refuse(field + "." + key, "must be a number");
    return params[key].get<double>();
  };
  RopeConfig& r = c.rope;
  r.type = params.value("rope_type", params.value("type", std::string("default")));
  r.theta = get("rope_theta", top_theta);
  if (r.type == "default") return;
  if (r.type != "linear" && r.type != "dynamic" && r.type != "llama3") {
    f.refuse(field + ".rope_type",
             "is '" + r.type + "'; tdist implements default, linear, dynamic and llama3");
  }
  if (!params.contains("factor")) f.refuse(field + ".factor", "is missing for " + r.type);
  r.factor = get("factor", 1.0);
  if (r.type == "llama3") {
    for (const char* key : {"low_freq_factor", "high_freq_factor"}) {
      if (!params.contains(key)) f.refuse(field + "." + key, "is missing for llama3");
    }
    r.low_freq_factor = get("low_freq_factor", 1.0);
    r.high_freq_factor = get("high_freq_factor", 4.0);
    r.original_max_position_embeddings = static_cast<int64_t>(
        get("original_max_position_embeddings", static_cast<double>(c.max_position_embeddings)));
    if (r.high_freq_factor == r.low_freq_factor) {
      f.refuse(field + ".high_freq_factor",
               "equals low_freq_factor; llama3 divides by their difference");
    }
  }
}

// The layer count sizes per-layer tables before validate() runs: a negative or absurd one
// must be refused here, not become a length_error or an allocation of terabytes.
void check_layer_count(Fields& f, const char* field, int64_t layers) {
  constexpr int64_t kMaxLayers = int64_t(1) << 16;
  if (layers < 1 || layers > kMaxLayers) {
    f.refuse(field, "is " + std::to_string(layers) + "; expected 1 to " +
                        std::to_string(kMaxLayers) + " layers");
  }
}

void parse_sliding_windows(Fields& f, ModelConfig& c) {
  check_layer_count(f, "num_hidden_layers", c.num_hidden_layers);
  c.sliding_windows.assign(static_cast<size_t>(c.num_hidden_layers), 0);
  if (c.family == ModelFamily::kMistral) {
    const int64_t window = f.has("sliding_window") ? f.integer("sliding_window") : 0;
    for (auto& w : c.sliding_windows) w = window;
  } else if (c.family == ModelFamily::kQwen2) {
    const bool use = f.boolean("use_sliding_window", false);
    // transformers drops the window unless use_sliding_window, and a null one means none.
    const bool has_window = f.has("sliding_window");
    const int64_t window = use && has_window ? f.integer("sliding_window") : 0;
    const int64_t first_sliding = f.integer("max_window_layers", 28);
    if (f.has("layer_types")) {
      const json& types = f.raw("layer_types");
      if (!types.is_array() || static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
        f.refuse("layer_types",
                 "must list one type per layer (" + std::to_string(c.num_hidden_layers) + ")");
      }
      for (size_t i = 0; i < types.size(); ++i) {
        const std::string t = types[i].is_string() ? types[i].get<std::string>() : "";
        if (t != "full_attention" && t != "sliding_attention") {
          f.refuse("layer_types", "holds " + types[i].dump() +
                                      "; tdist implements full_attention and sliding_attention");
        }
        c.sliding_windows[i] = t == "sliding_attention" ? window : 0;
      }
    } else {
      for (int64_t i = first_sliding; i < c.num_hidden_layers; ++i) {
        c.sliding_windows[static_cast<size_t>(i)] = window;
      }
    }
  } else if (f.has("sliding_window")) {
    f.refuse("sliding_window", "is not part of the llama architecture");
  }
  for (int64_t w : c.sliding_windows) {
    if (w < 0) f.refuse("sliding_window", "must be positive or null, got " + std::to_string(w));
  }
}

void check_activation(Fields& f, const std::string& key, const std::string& act) {
  static const std::set<std::string> known = {
      "silu", "swish", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu"};
  if (!known.count(act)) {
    f.refuse(key, "is '" + act +
                      "'; tdist implements silu, gelu, gelu_new, gelu_pytorch_tanh "
                      "and relu");
  }
}

void parse_llama_like(Fields& f, ModelConfig& c) {
  static const int64_t kDefaultMaxPositions[] = {2048, 131072, 32768};
  c.vocab_size = f.integer("vocab_size");
  c.hidden_size = f.integer("hidden_size");
  c.intermediate_size = f.integer("intermediate_size");
  c.num_hidden_layers = f.integer("num_hidden_layers");
  c.num_attention_heads = f.integer("num_attention_heads");
  c.num_key_value_heads = f.integer("num_key_value_heads", c.num_attention_heads);
  if (c.num_attention_heads <= 0) f.refuse("num_attention_heads", "must be positive");
  c.head_dim = f.integer("head_dim", c.hidden_size / c.num_attention_heads);
  c.max_position_embeddings =
      f.integer("max_position_embeddings", kDefaultMaxPositions[static_cast<int>(c.family)]);
  c.hidden_act = f.string("hidden_act", "silu");
  check_activation(f, "hidden_act", c.hidden_act);
  c.norm_eps = f.number("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.attention_dropout = f.number("attention_dropout", 0.0);
  if (c.family == ModelFamily::kLlama) {
    c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
    c.mlp_bias = f.boolean("mlp_bias", false);
  } else {
    c.qkv_bias = c.family == ModelFamily::kQwen2;  // transformers hard-codes both families'
  }
  if (c.family == ModelFamily::kQwen2 && f.boolean("use_mrope", false)) {
    f.refuse("use_mrope", "is true: multimodal rotary embeddings (Qwen2-VL) are not implemented");
  }
  parse_rope(f, c);
  parse_sliding_windows(f, c);
}

void parse_gpt2(Fields& f, ModelConfig& c) {
  c.vocab_size = f.integer("vocab_size", 50257);
  c.max_position_embeddings =
      f.has("n_positions") ? f.integer("n_positions") : f.integer("max_position_embeddings", 1024);
  c.hidden_size = f.has("n_embd") ? f.integer("n_embd") : f.integer("hidden_size", 768);
  c.num_hidden_layers =
      f.has("n_layer") ? f.integer("n_layer") : f.integer("num_hidden_layers", 12);
  c.num_attention_heads =
      f.has("n_head") ? f.integer("n_head") : f.integer("num_attention_heads", 12);
  if (c.num_attention_heads <= 0) f.refuse("n_head", "must be positive");
  c.num_key_value_heads = c.num_attention_heads;
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.intermediate_size = f.integer("n_inner", 4 * c.hidden_size);
  c.hidden_act = f.string("activation_function", "gelu_new");
  check_activation(f, "activation_function", c.hidden_act);
  c.norm_eps = f.number("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", true);
  c.attention_dropout = f.number("attn_pdrop", 0.1);
  c.embedding_dropout = f.number("embd_pdrop", 0.1);
  c.residual_dropout = f.number("resid_pdrop", 0.1);
  c.scale_attn_weights = f.boolean("scale_attn_weights", true);
  c.scale_attn_by_inverse_layer_idx = f.boolean("scale_attn_by_inverse_layer_idx", false);
  if (f.boolean("add_cross_attention", false)) {
    f.refuse("add_cross_attention", "is true; tdist's GPT-2 is a decoder without cross-attention");
  }
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  check_layer_count(f, f.has("n_layer") ? "n_layer" : "num_hidden_layers", c.num_hidden_layers);
  c.sliding_windows.assign(static_cast<size_t>(c.num_hidden_layers), 0);
}

void put_token_ids(json& j, const char* key, const std::vector<int64_t>& ids) {
  if (ids.empty()) {
    j[key] = nullptr;
  } else if (ids.size() == 1) {
    j[key] = ids[0];
  } else {
    j[key] = ids;
  }
}

std::string dtype_text(c10::ScalarType t) {
  switch (t) {
    case c10::kBFloat16:
      return "bfloat16";
    case c10::kHalf:
      return "float16";
    default:
      return "float32";
  }
}

}  // namespace

std::string model_type_of(ModelFamily family) {
  return info(family).model_type;
}
std::string architecture_of(ModelFamily family) {
  return info(family).architecture;
}

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    TDIST_THROW(InvalidArgument, "models: " + where + " is not JSON: " + e.what());
  }
  if (!j.is_object()) TDIST_THROW(InvalidArgument, "models: " + where + " is not a JSON object");
  Fields f(j, where);
  ModelConfig c;
  c.family = family_from(f, j);
  if (c.family == ModelFamily::kGPT2) {
    parse_gpt2(f, c);
  } else {
    parse_llama_like(f, c);
  }
  c.dtype = dtype_from(f, j);
  c.initializer_range = f.number("initializer_range", 0.02);
  const auto bos = token_ids(f, j, "bos_token_id");
  if (!bos.empty()) c.bos_token_id = bos[0];
  c.eos_token_ids = token_ids(f, j, "eos_token_id");
  const auto pad = token_ids(f, j, "pad_token_id");
  if (!pad.empty()) c.pad_token_id = pad[0];
  f.check_all_known(c.family);
  c.source_json = text;
  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    TDIST_THROW(InvalidArgument, std::string(e.what()) + " (in " + where + ")");
  }
  return c;
}

ModelConfig ModelConfig::load(const std::string& dir) {
  const std::filesystem::path path = std::filesystem::path(dir) / "config.json";
  std::ifstream in(path);
  if (!in) {
    TDIST_THROW(InvalidArgument, "models: '" + dir +
                                     "' has no config.json; a model folder (as "
                                     "save_pretrained writes it) holds config.json and its "
                                     "safetensors");
  }
  std::stringstream text;
  text << in.rdbuf();
  return from_json(text.str(), path.string());
}

void ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* name) {
    TDIST_CHECK_ARG(v > 0,
                    std::string("models: ") + name + " must be positive, got " + std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(max_position_embeddings, "max_position_embeddings");
  TDIST_CHECK_ARG(num_attention_heads % num_key_value_heads == 0,
                  "models: num_attention_heads (" + std::to_string(num_attention_heads) +
                      ") must be a multiple of num_key_value_heads (" +
                      std::to_string(num_key_value_heads) + ")");
  if (family == ModelFamily::kGPT2) {
    TDIST_CHECK_ARG(hidden_size % num_attention_heads == 0,
                    "models: n_embd (" + std::to_string(hidden_size) +
                        ") must be a multiple of n_head (" + std::to_string(num_attention_heads) +
                        ")");
  } else {
    TDIST_CHECK_ARG(head_dim % 2 == 0, "models: head_dim must be even for rotary embeddings, got " +
                                           std::to_string(head_dim));
  }
  TDIST_CHECK_ARG(static_cast<int64_t>(sliding_windows.size()) == num_hidden_layers,
                  "models: sliding_windows needs one entry per layer");
}

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size, q = num_attention_heads * head_dim,
                kv = num_key_value_heads * head_dim, m = intermediate_size;
  int64_t per_layer = 0;
  int64_t outer = vocab_size * h + (tie_word_embeddings ? 0 : vocab_size * h);
  if (family == ModelFamily::kGPT2) {
    per_layer = 4 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * m + m) + (m * h + h);
    outer += max_position_embeddings * h + 2 * h;
  } else {
    per_layer = 2 * h + h * (q + 2 * kv) + (qkv_bias ? q + 2 * kv : 0) + q * h + (o_bias ? h : 0) +
                3 * h * m + (mlp_bias ? 2 * m + h : 0);
    outer += h;
  }
  return outer + num_hidden_layers * per_layer;
}

std::string ModelConfig::to_json() const {
  json j = json::object();
  if (!source_json.empty()) j = json::parse(source_json);
  j["architectures"] = {architecture_of(family)};
  j["model_type"] = model_type_of(family);
  j["vocab_size"] = vocab_size;
  j["initializer_range"] = initializer_range;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j.erase("torch_dtype");
  j["dtype"] = dtype_text(dtype);
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  put_token_ids(j, "eos_token_id", eos_token_ids);
  j["pad_token_id"] = pad_token_id ? json(*pad_token_id) : json(nullptr);
  if (family == ModelFamily::kGPT2) {
    for (const char* legacy :
         {"hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings"}) {
      j.erase(legacy);
    }
    j["n_embd"] = hidden_size;
    j["n_layer"] = num_hidden_layers;
    j["n_head"] = num_attention_heads;
    j["n_positions"] = max_position_embeddings;
    j["n_inner"] = intermediate_size;
    j["activation_function"] = hidden_act;
    j["layer_norm_epsilon"] = norm_eps;
    j["attn_pdrop"] = attention_dropout;
    j["embd_pdrop"] = embedding_dropout;
    j["resid_pdrop"] = residual_dropout;
    j["scale_attn_weights"] = scale_attn_weights;
    j["scale_attn_by_inverse_layer_idx"] = scale_attn_by_inverse_layer_idx;
    return j.dump(2) + "\n";
  }
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["hidden_act"] = hidden_act;
  j["rms_norm_eps"] = norm_eps;
  j["attention_dropout"] = attention_dropout;
  if (family == ModelFamily::kLlama) {
    j["attention_bias"] = qkv_bias;
    j["mlp_bias"] = mlp_bias;
  }
  json rope_params = {{"rope_type", rope.type}, {"rope_theta", rope.theta}};
  if (rope.type != "default") rope_params["factor"] = rope.factor;
  if (rope.type == "llama3") {
    rope_params["low_freq_factor"] = rope.low_freq_factor;
    rope_params["high_freq_factor"] = rope.high_freq_factor;
    rope_params["original_max_position_embeddings"] = rope.original_max_position_embeddings;
  }
  j["rope_parameters"] = rope_params;  // transformers 5.x
  j["rope_theta"] = rope.theta;        // and 4.x
  j["rope_scaling"] = rope.type == "default" ? json(nullptr) : rope_params;
  if (family == ModelFamily::kMistral) {
    j["sliding_window"] = sliding_windows.empty() || sliding_windows[0] == 0
                              ? json(nullptr)
                              : json(sliding_windows[0]);
  } else if (family == ModelFamily::kQwen2) {
    int64_t window = 0;
    json types = json::array();
    for (int64_t w : sliding_windows) {
      window = std::max(window, w);
      types.push_back(w > 0 ? "sliding_attention" : "full_attention");
    }
    j["use_sliding_window"] = window > 0;
    j["sliding_window"] = window > 0 ? json(window) : json(nullptr);
    j["layer_types"] = types;
  }
  return j.dump(2) + "\n";
}

}  // namespace tdist::models

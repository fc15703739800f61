#include "gpt/model_spec.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tdist/error.h"

namespace gpt {
namespace fs = std::filesystem;
namespace {

int64_t default_intermediate(const ModelSpec& s) {
  if (s.intermediate > 0) return s.intermediate;
  if (s.family == "gpt2") return 4 * s.n_embd;
  // Llama's rule: 2/3 of 4x, rounded up to a multiple of 32.
  const int64_t width = 8 * s.n_embd / 3;
  return (width + 31) / 32 * 32;
}

std::string read_file(const std::string& path, const std::string& flag) {
  std::ifstream in(path);
  TDIST_CHECK_ARG(static_cast<bool>(in), flag + ": cannot read '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

void ModelSpec::validate() const {
  auto check = [](bool ok, const std::string& message) {
    if (!ok) TDIST_THROW(tdist::InvalidArgument, message);
  };
  check(from.empty() || config_file.empty(),
        "--from and --model-config both name a model; pass one (--from fine-tunes a folder's "
        "weights, --model-config pretrains a config from scratch)");
  check(family == "llama" || family == "mistral" || family == "qwen2" || family == "gpt2",
        "--family must be llama, mistral, qwen2 or gpt2, got '" + family + "'");
  check(n_layer >= 1, "--n-layer must be >= 1, got " + std::to_string(n_layer));
  check(n_head >= 1, "--n-head must be >= 1, got " + std::to_string(n_head));
  check(n_kv_head >= 0 && (n_kv_head == 0 || n_head % n_kv_head == 0),
        "--n-kv-head must divide --n-head (" + std::to_string(n_head) + "), got " +
            std::to_string(n_kv_head) + " (0: as many as --n-head)");
  check(n_embd >= 1 && n_embd % n_head == 0,
        "--n-embd (" + std::to_string(n_embd) + ") must be a positive multiple of --n-head (" +
            std::to_string(n_head) + "); pick e.g. --n-embd " + std::to_string(n_head * 32));
  check(intermediate >= 0, "--intermediate must be >= 0 (0: the family's default)");
  check(block_size >= 2, "--block-size must be >= 2, got " + std::to_string(block_size));
  check(max_positions == 0 || max_positions >= block_size,
        "--max-positions (" + std::to_string(max_positions) + ") must be >= --block-size (" +
            std::to_string(block_size) + ") or 0");
  check(dropout >= 0.0 && dropout < 1.0,
        "--dropout must be in [0, 1), got " + std::to_string(dropout));
  check(rope_theta > 0.0, "--rope-theta must be > 0");
}

nlohmann::json ModelSpec::to_hf_json(int64_t vocab_size, std::optional<int64_t> bos,
                                     std::optional<int64_t> eos) const {
  const int64_t positions = max_positions > 0 ? max_positions : block_size;
  nlohmann::json j;
  if (family == "gpt2") {
    j = {{"model_type", "gpt2"},
         {"architectures", {"GPT2LMHeadModel"}},
         {"vocab_size", vocab_size},
         {"n_embd", n_embd},
         {"n_layer", n_layer},
         {"n_head", n_head},
         {"n_inner", default_intermediate(*this)},
         {"n_positions", positions},
         {"resid_pdrop", dropout},
         {"embd_pdrop", dropout},
         {"attn_pdrop", dropout},
         {"tie_word_embeddings", tie_weights}};
  } else {
    static const std::map<std::string, std::string> architectures = {
        {"llama", "LlamaForCausalLM"},
        {"mistral", "MistralForCausalLM"},
        {"qwen2", "Qwen2ForCausalLM"}};
    j = {{"model_type", family},
         {"architectures", {architectures.at(family)}},
         {"vocab_size", vocab_size},
         {"hidden_size", n_embd},
         {"intermediate_size", default_intermediate(*this)},
         {"num_hidden_layers", n_layer},
         {"num_attention_heads", n_head},
         {"num_key_value_heads", n_kv_head > 0 ? n_kv_head : n_head},
         {"max_position_embeddings", positions},
         {"rms_norm_eps", 1e-5},
         {"hidden_act", "silu"},
         {"attention_dropout", dropout},
         {"tie_word_embeddings", tie_weights},
         {"rope_theta", rope_theta}};
  }
  j["dtype"] = "float32";
  if (bos) j["bos_token_id"] = *bos;
  if (eos) j["eos_token_id"] = *eos;
  return j;
}

void ModelSpec::check_from_folder() const {
  TDIST_CHECK_ARG(from.empty() || fs::is_regular_file(fs::path(from) / "config.json"),
                  "--from " + from +
                      " is not a model folder: it has no config.json (a Hugging Face model "
                      "folder holds config.json, model.safetensors and the tokenizer's files)");
}

tdist::models::ModelConfig ModelSpec::resolve(int64_t vocab_size, std::optional<int64_t> bos,
                                              std::optional<int64_t> eos) const {
  if (!from.empty()) {
    check_from_folder();
    return tdist::models::ModelConfig::load(from);
  }
  if (!config_file.empty()) {
    return tdist::models::ModelConfig::from_json(read_file(config_file, "--model-config"),
                                                 config_file);
  }
  return tdist::models::ModelConfig::from_json(to_hf_json(vocab_size, bos, eos).dump(),
                                               "the model flags (--family " + family + ")");
}

std::string ModelSpec::describe() const {
  if (!from.empty()) return "fine-tuning " + from;
  if (!config_file.empty()) return "pretraining " + config_file;
  std::ostringstream out;
  out << family << " n_layer=" << n_layer << " n_head=" << n_head;
  if (n_kv_head > 0 && n_kv_head != n_head) out << " n_kv_head=" << n_kv_head;
  out << " n_embd=" << n_embd << " block_size=" << block_size;
  return out.str();
}

nlohmann::json to_json(const ModelSpec& s) {
  return {{"from", s.from},
          {"model_config", s.config_file},
          {"family", s.family},
          {"n_layer", s.n_layer},
          {"n_head", s.n_head},
          {"n_kv_head", s.n_kv_head},
          {"n_embd", s.n_embd},
          {"intermediate", s.intermediate},
          {"block_size", s.block_size},
          {"max_positions", s.max_positions},
          {"dropout", s.dropout},
          {"tie_weights", s.tie_weights},
          {"rope_theta", s.rope_theta}};
}

}  // namespace gpt

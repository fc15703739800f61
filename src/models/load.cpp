// from_pretrained: Note [Loading into shards] in tdist/models/pretrained.h.

#include <set>
#include <sstream>

#include <ATen/ATen.h>

#include "tdist/checkpoint/safetensors_file.h"
#include "tdist/detail/util/text.h"
#include "tdist/error.h"
#include "tdist/fsdp/deferred_init.h"
#include "tdist/models/pretrained.h"

namespace tdist::models {
namespace {

std::string shape_text(c10::IntArrayRef shape) {
  return c10::str(shape);
}

std::string base_prefix(const ModelConfig& config) {
  return config.family == ModelFamily::kGPT2 ? "transformer." : "model.";
}

// The config fields that give the model's tensor shapes, for errors about a shape.
std::string shape_fields(const ModelConfig& c) {
  std::ostringstream s;
  s << "vocab_size " << c.vocab_size << ", hidden_size " << c.hidden_size << ", intermediate_size "
    << c.intermediate_size << ", num_attention_heads " << c.num_attention_heads
    << ", num_key_value_heads " << c.num_key_value_heads << ", head_dim " << c.head_dim
    << ", max_position_embeddings " << c.max_position_embeddings;
  return s.str();
}

// Tensors transformers also skips: buffers older exports saved (rotary inverse frequencies,
// GPT-2's causal-mask buffers) and the head of a model whose head is the embedding.
bool skipped_on_load(const ModelConfig& config, const std::string& name) {
  if (util::ends_with(name, "rotary_emb.inv_freq") || util::ends_with(name, ".attn.bias") ||
      util::ends_with(name, ".attn.masked_bias")) {
    return true;
  }
  return config.tie_word_embeddings && name == "lm_head.weight";
}

// The file's name for a model tensor: the same, or without the base model's prefix (a
// folder saved from GPT2Model or LlamaModel, as the original GPT-2 files are).
class NameMap {
 public:
  NameMap(const ModelConfig& config, const checkpoint::SafetensorsFolder& files)
      : prefix_(base_prefix(config)), files_(files) {}

  std::optional<std::string> file_name(const std::string& model_name) const {
    if (files_.contains(model_name)) return model_name;
    if (model_name.rfind(prefix_, 0) == 0) {
      const std::string bare = model_name.substr(prefix_.size());
      if (files_.contains(bare)) return bare;
    }
    return std::nullopt;
  }

 private:
  std::string prefix_;
  const checkpoint::SafetensorsFolder& files_;
};

// Every tensor of the model is in the files with its shape and a loadable dtype, and every
// tensor of the files belongs to the model: checked before anything is read.
void check_tensors(const CausalLM& model, const ModelConfig& config,
                   const checkpoint::SafetensorsFolder& files, const NameMap& names) {
  std::set<std::string> used;
  std::vector<std::string> missing;
  for (const auto& item : model.named_parameters()) {
    const auto file_name = names.file_name(item.key());
    if (!file_name) {
      missing.push_back(item.key());
      continue;
    }
    used.insert(*file_name);
    const auto& entry = files.entry(*file_name);
    const std::string file = files.file_of(*file_name).path();
    if (c10::IntArrayRef(entry.shape) != item.value().sizes()) {
      TDIST_THROW(InvalidArgument, "from_pretrained: tensor '" + *file_name + "' in '" + file +
                                       "' has shape " + shape_text(entry.shape) +
                                       ", but config.json (" + shape_fields(config) +
                                       ") makes it " + shape_text(item.value().sizes()) +
                                       "; the weights and config.json are of different models");
    }
    if (!at::isFloatingType(entry.dtype)) {
      TDIST_THROW(InvalidArgument, "from_pretrained: tensor '" + *file_name + "' in '" + file +
                                       "' is " + c10::toString(entry.dtype) +
                                       ", not a floating-point weight");
    }
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i)
      list += (i ? ", '" : "'") + missing[i] + "'";
    if (missing.size() > 5) list += " and " + std::to_string(missing.size() - 5) + " more";
    TDIST_THROW(InvalidArgument, "from_pretrained: the safetensors in '" + files.dir() + "' lack " +
                                     list +
                                     ", which the model config.json describes "
                                     "needs (an incomplete download, or another model's files?)");
  }
  for (const auto& name : files.names()) {
    if (used.count(name) || skipped_on_load(config, name)) continue;
    TDIST_THROW(InvalidArgument,
                "from_pretrained: '" + files.file_of(name).path() + "' holds tensor '" + name +
                    "', which is not a parameter of the " + architecture_of(config.family) +
                    " config.json describes (" + shape_fields(config) + ", " +
                    std::to_string(config.num_hidden_layers) +
                    " layers); the weights and config.json are of different models");
  }
}

}  // namespace

std::shared_ptr<CausalLM> from_pretrained(const std::string& dir, const LoadOptions& options) {
  const ModelConfig config = ModelConfig::load(dir);
  const checkpoint::SafetensorsFolder files(dir);
  const NameMap names(config, files);
  std::shared_ptr<CausalLM> model;
  {
    fsdp::MetaDeviceGuard meta;  // shapes only: each rank allocates just what it keeps
    model = build_model(config);
    model->to(options.dtype().value_or(config.dtype));
  }
  check_tensors(*model, config, files, names);
  if (options.fully_shard()) fully_shard_model(model, options.fsdp_options());
  const auto load = [&](const fsdp::TensorRows& rows) {
    files.read_rows(*names.file_name(rows.name), rows.row_begin, rows.rows);
  };
  fsdp::materialize(model, fsdp::MaterializeOptions().device(options.device()).load_fn(load));
  model->eval();  // as transformers' from_pretrained: dropout off until train()
  return model;
}

}  // namespace tdist::models

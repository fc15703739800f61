#pragma once

// Hugging Face model folders in and out of tdist, sharded or not:
//
//   auto model = tdist::models::from_pretrained("Llama-3.2-1B", tdist::models::LoadOptions()
//       .dtype(torch::kFloat32).fully_shard(true));          // each rank: its shards only
//   ... train: tdist::fsdp::forward(model, ids), backward, optimizer step ...
//   tdist::models::save_pretrained(*model, "out", tdist::models::SaveOptions()
//       .dtype(torch::kBFloat16).files_from("Llama-3.2-1B"));  // tokenizer files too
//
// Note [Loading into shards]
// from_pretrained builds the model on the meta device, applies fully_shard to every decoder
// layer and then the root (when asked), and materializes it with a loader
// (tdist::fsdp::MaterializeOptions::load_fn) that reads from the safetensors only the rows of
// this rank's shards, straight into the shards' own storage, converting their dtype on the
// way (tdist::checkpoint::SafetensorsFile::read_rows). No rank ever holds a full parameter
// or a file page it does not keep: its peak is its shards (bench/RESULTS.md, "Models").
// Every tensor's name and shape are checked against the model before any is read: a
// missing, extra or misshapen tensor is an error naming it, its file and the config fields
// that give its shape.
//
// Note [Saving from shards]
// save_pretrained lays out the files first (transformers' split: tensors in name order, a
// new file when the next would pass max_shard_bytes), rank 0 writes each file's header and
// sizes it, and every rank writes the rows it owns at their offsets with pwrite, converting
// to the saved dtype; no rank gathers a parameter. Every rank must see the folder (one
// machine, or a shared file system, as for sharded checkpoints). The folder is written
// under a temporary name and renamed into place once complete, so a failure on any rank
// leaves no partial export, and a previous export at that path stays until the new one
// is whole.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "tdist/arg.h"
#include "tdist/fsdp/deferred_init.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/models/causal_lm.h"
#include "tdist/models/config.h"

namespace tdist::models {

/// A model of config's family, parameters initialised by LibTorch's layer defaults (under
/// tdist::fsdp::MetaDeviceGuard: shapes only, no storage).
std::shared_ptr<CausalLM> build_model(const ModelConfig& config);

/// transformers' initialisation of the family (_init_weights) as a deferred-init init_fn:
/// linear, Conv1D and embedding weights ~ N(0, initializer_range), biases 0, norm weights 1
/// (GPT-2's residual projections with std / sqrt(2 * n_layer)). For pretraining from a
/// config: tdist::fsdp::materialize(model, MaterializeOptions().init_fn(init_weights_fn(c))).
fsdp::ModuleInitFn init_weights_fn(const ModelConfig& config);

/// fully_shard on each decoder layer, then on the root (torchtitan's order).
void fully_shard_model(const std::shared_ptr<CausalLM>& model,
                       const fsdp::FullyShardOptions& options = {});

struct LoadOptions {
  /// Where the parameters (or this rank's shards) are placed.
  TDIST_ARG(c10::Device, device) = c10::Device(c10::kCPU);
  /// The parameters' dtype; default: the dtype config.json says the weights were saved in.
  TDIST_ARG(std::optional<c10::ScalarType>, dtype) = std::nullopt;
  /// Shard with fully_shard_model while loading (Note [Loading into shards]); collective
  /// over the FSDP group.
  TDIST_ARG(bool, fully_shard) = false;
  TDIST_ARG(fsdp::FullyShardOptions, fsdp_options) = {};
};

/// Loads a model folder (config.json, model.safetensors or its shards and index).
std::shared_ptr<CausalLM> from_pretrained(const std::string& dir, const LoadOptions& options = {});

struct SaveOptions {
  /// dtype of the saved weights (and config.json's dtype); default: the parameters' dtype.
  TDIST_ARG(std::optional<c10::ScalarType>, dtype) = std::nullopt;
  /// Largest safetensors file (transformers' max_shard_size, default "5GB"); a model that
  /// fits one file is saved as model.safetensors with no index.
  TDIST_ARG(int64_t, max_shard_bytes) = int64_t(5) * 1000 * 1000 * 1000;
  /// A model folder whose tokenizer files (tokenizer.json, tokenizer_config.json,
  /// tokenizer.model, special_tokens_map.json, vocab.json, merges.txt, added_tokens.json)
  /// and generation_config.json are copied along; without one, generation_config.json is
  /// written from the config's token ids.
  TDIST_ARG(std::string, files_from) = "";
};

/// Writes `model` as a Hugging Face model folder at `dir` (Note [Saving from shards]).
/// Collective over the default process group when one is initialised: every rank calls it.
/// Returns the files written, relative to `dir`.
std::vector<std::string> save_pretrained(const CausalLM& model, const std::string& dir,
                                         const SaveOptions& options = {});

}  // namespace tdist::models

#pragma once

// Single-file interchange of a full (unsharded) state dict with the rest of the world:
//  - PyTorch's own format: Python's torch.load() reads what export_torch_file() writes
//    (a dict name -> tensor), and import_torch_file() reads torch.save(state_dict) output.
//  - safetensors: 8-byte little-endian header length, JSON header, raw little-endian bytes.
// Files are written to a temp name, synced and renamed: a crash never leaves half a file.

#include <map>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace tdist::checkpoint {

/// Name -> whole tensor, in name order.
using TensorMap = std::map<std::string, at::Tensor>;

void export_torch_file(const TensorMap& tensors, const std::string& path);
TensorMap import_torch_file(const std::string& path);

/// `metadata` goes to the header's "__metadata__" (string -> string, as the format says).
void save_safetensors(const TensorMap& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata = {});
TensorMap load_safetensors(const std::string& path,
                           std::map<std::string, std::string>* metadata = nullptr);

/// Parameters and buffers by PyTorch name (no prefix), detached, contiguous, on the CPU
/// (copies). For an FSDP (fully_shard) module the parameters are gathered whole: then it is
/// collective, every rank of the shard group must call it.
TensorMap module_tensors(const torch::nn::Module& module);
/// Copies tensors into the module's parameters and buffers. With strict, a missing or extra
/// name or a shape mismatch is a CheckpointError listing every offender. Shapes are the
/// whole tensors' also for an FSDP module, whose shards receive their rows (local).
void load_module_tensors(torch::nn::Module& module, const TensorMap& tensors, bool strict = true);

/// A full checkpoint (any world size) gathered into whole tensors on this process, e.g. to
/// export it. `prefix` selects and strips names ("model." for save_module checkpoints).
TensorMap read_full_tensors(const std::string& dir, const std::string& prefix = "");

}  // namespace tdist::checkpoint

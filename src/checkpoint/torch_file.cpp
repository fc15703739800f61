// PyTorch's own file format (a zip of pickled data), via LibTorch's pickle_save/pickle_load.

#include <ATen/core/Dict.h>
#include <torch/serialize.h>

#include "checkpoint/file_io.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/error.h"

namespace tdist::checkpoint {
namespace {

/// A tensor that pickles as exactly itself: contiguous, CPU, and not a view into a bigger
/// storage (pickle writes whole storages).
at::Tensor standalone(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kCPU).contiguous();
  if (c.storage_offset() != 0 || c.storage().nbytes() != c.nbytes()) c = c.clone();
  return c;
}

}  // namespace

void export_torch_file(const TensorMap& tensors, const std::string& path) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) {
    TDIST_CHECK_ARG(t.defined(), "export_torch_file: tensor '" + name + "' is undefined");
    dict.insert(name, standalone(t));
  }
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  detail::write_file_atomic(path, std::string(bytes.begin(), bytes.end()), true);
}

TensorMap import_torch_file(const std::string& path) {
  const std::string bytes = detail::read_whole_file(path);
  c10::IValue value;
  try {
    value = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    TDIST_THROW(CheckpointError, "import_torch_file: '" + path +
                                     "' is not a readable torch file (" + e.what() + ")");
  }
  if (!value.isGenericDict()) {
    TDIST_THROW(CheckpointError,
                "import_torch_file: '" + path + "' holds a " + value.tagKind() +
                    ", not a dict of tensors. From Python, save a plain dict: "
                    "torch.save(dict(model.state_dict()), path) (an OrderedDict does not load "
                    "in LibTorch)");
  }
  TensorMap out;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      TDIST_THROW(CheckpointError, "import_torch_file: '" + path +
                                       "' has a non-string key or non-tensor value; expected "
                                       "a state dict (name -> tensor)");
    }
    out[entry.key().toStringRef()] = entry.value().toTensor();
  }
  return out;
}

}  // namespace tdist::checkpoint

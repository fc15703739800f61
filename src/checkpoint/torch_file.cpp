// PyTorch's own file format (a zip of pickled data): written with LibTorch's Pickler and
// stream writer, read with pickle_load.

#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include "checkpoint/file_io.h"
#include "checkpoint/torch_blob.h"
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

// torch::pickle_save, but with the dict untagged: its Pickler tags typed containers with
// torch.jit._pickle.restore_type_tag, a global torch.load(weights_only=True) (the default
// since PyTorch 2.6) refuses. An untagged dict of tensors is exactly what torch.save writes.
std::vector<char> pickle_untagged(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t size) { pickle.insert(pickle.end(), buf, buf + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> container;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    const char* bytes = static_cast<const char*>(data);
    container.insert(container.end(), bytes, bytes + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return container;
}

/// Tensors anywhere in `value` replaced by standalone copies.
c10::IValue standalone_tensors(const c10::IValue& value) {
  if (value.isTensor()) return standalone(value.toTensor());
  if (value.isGenericDict()) {
    c10::impl::GenericDict dict(value.toGenericDict().keyType(), value.toGenericDict().valueType());
    for (const auto& e : value.toGenericDict()) dict.insert(e.key(), standalone_tensors(e.value()));
    return dict;
  }
  return value;
}

}  // namespace

namespace detail {

std::string torch_save_bytes(const c10::IValue& value) {
  const std::vector<char> bytes = pickle_untagged(standalone_tensors(value));
  return std::string(bytes.begin(), bytes.end());
}

c10::IValue torch_load_bytes(const void* data, size_t size, const std::string& where) {
  const char* p = static_cast<const char*>(data);
  try {
    return torch::pickle_load(std::vector<char>(p, p + size));
  } catch (const std::exception& e) {
    TDIST_THROW(CheckpointError,
                "checkpoint: " + where + " is not readable torch.save data (" + e.what() + ")");
  }
}

}  // namespace detail

void export_torch_file(const TensorMap& tensors, const std::string& path) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) {
    TDIST_CHECK_ARG(t.defined(), "export_torch_file: tensor '" + name + "' is undefined");
    dict.insert(name, t);
  }
  detail::write_file_atomic(path, detail::torch_save_bytes(c10::IValue(dict)), true);
}

TensorMap import_torch_file(const std::string& path) {
  const std::string bytes = detail::read_whole_file(path);
  const c10::IValue value =
      detail::torch_load_bytes(bytes.data(), bytes.size(), "import_torch_file: '" + path + "'");
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

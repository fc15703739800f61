// PyTorch's own file format (a zip of pickled data): written with LibTorch's Pickler and
// stream writer, read with pickle_load.

#include <algorithm>
#include <cstring>
#include <functional>

#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/storage_context.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <torch/serialize.h>

#include "checkpoint/file_io.h"
#include "checkpoint/torch_blob.h"
#include "checkpoint/zip_crc_filler.h"
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
void pickle_untagged(const c10::IValue& value,
                     const std::function<void(const void*, size_t)>& sink) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t size) { pickle.insert(pickle.end(), buf, buf + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  // The writer's own CRC-32 is slow; the filler computes it (Note [Filling zip CRCs]).
  detail::ZipCrcFiller filler(sink);
  caffe2::serialize::PyTorchStreamWriter writer(
      [&](const void* data, size_t size) {
        filler.write(data, size);
        return size;
      },
      /*compute_crc32=*/false);
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  filler.finish();
}

/// The bytes of a torch.save archive in memory, read in place (pickle_load would copy them).
class MemoryReadAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  MemoryReadAdapter(const void* data, size_t size)
      : data_(static_cast<const char*>(data)), size_(size) {}
  size_t size() const override { return size_; }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= size_) return 0;
    n = std::min<size_t>(n, size_ - pos);
    std::memcpy(buf, data_ + pos, n);
    return n;
  }

 private:
  const char* data_;
  size_t size_;
};

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

void torch_save_to(const c10::IValue& value, const std::function<void(const void*, size_t)>& sink) {
  pickle_untagged(standalone_tensors(value), sink);
}

std::string torch_save_bytes(const c10::IValue& value) {
  std::string bytes;
  torch_save_to(value, [&](const void* data, size_t size) {
    bytes.append(static_cast<const char*>(data), size);
  });
  return bytes;
}

namespace {

/// read()'s value; LibTorch's errors become a CheckpointError naming `where`.
template <typename Read>
c10::IValue read_or_name(const std::string& where, const Read& read) {
  try {
    return read();
  } catch (const tdist::Error&) {
    throw;
  } catch (const std::exception& e) {
    TDIST_THROW(CheckpointError,
                "checkpoint: " + where + " is not readable torch.save data (" + e.what() + ")");
  }
}

}  // namespace

c10::IValue torch_load_bytes(const void* data, size_t size, const std::string& where) {
  return read_or_name(where, [&] {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<MemoryReadAdapter>(data, size));
    return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                             std::nullopt, std::nullopt, std::nullopt, reader);
  });
}

// Note [Loading in place]
// LibTorch's reader copies each storage record out of the archive into memory of its own
// (PyTorchStreamReader::getRecord), so reading a distributed checkpoint's chunk cost a fresh
// allocation and a copy of every byte on top of the read and the copy into the target. The
// records of a torch.save archive are stored uncompressed (at 64-byte aligned offsets), so a
// storage can be the record's bytes where they already are: every "data/<key>" record is
// handed to the unpickler through a DeserializationStorageContext (the mechanism
// torch.package uses for storages it already holds), as a storage viewing `bytes` that
// keeps `bytes` alive. The unpickler then rebuilds the tensors on those storages, checking
// their sizes against the storages' byte sizes as usual. An archive written big-endian, or
// one whose records cannot be located, is read the copying way.
c10::IValue torch_load_in_place(const at::Tensor& bytes, const std::string& where) {
  TDIST_CHECK_ARG(bytes.dim() == 1 && bytes.scalar_type() == at::kByte && bytes.is_contiguous() &&
                      bytes.device().is_cpu(),
                  "torch_load_in_place: expected a contiguous 1-D byte tensor on the CPU");
  const auto* data = static_cast<const char*>(bytes.const_data_ptr());
  const auto size = static_cast<size_t>(bytes.numel());
  return read_or_name(where, [&]() -> c10::IValue {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<MemoryReadAdapter>(data, size));
    if (reader.hasRecord("byteorder")) {
      const auto [order, order_size] = reader.getRecord("byteorder");
      const std::string text(static_cast<const char*>(order.get()), order_size);
      if (text != "little") return torch_load_bytes(data, size, where);
    }
    auto storages = std::make_shared<torch::jit::DeserializationStorageContext>();
    const std::string prefix = "data/";
    for (const std::string& record : reader.getAllRecords()) {
      if (record.compare(0, prefix.size(), prefix) != 0) continue;
      const size_t offset = reader.getRecordOffset(record);
      const size_t length = reader.getRecordSize(record);
      if (offset > size || length > size - offset) return torch_load_bytes(data, size, where);
      // The storage's memory is `bytes`' own; its deleter only drops the reference.
      auto* owner = new at::Tensor(bytes);
      at::DataPtr view(
          const_cast<char*>(data) + offset, owner,
          [](void* ctx) { delete static_cast<at::Tensor*>(ctx); }, at::kCPU);
      storages->addStorage(record.substr(prefix.size()),
                           c10::Storage(c10::Storage::use_byte_size_t(), length, std::move(view),
                                        /*allocator=*/nullptr, /*resizable=*/false));
    }
    return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                             std::nullopt, std::nullopt, std::nullopt, reader,
                                             torch::jit::Unpickler::defaultTypeParser, storages);
  });
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

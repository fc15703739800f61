#include "checkpoint/dcp_metadata.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "checkpoint/pickle_reader.h"
#include "checkpoint/pickle_writer.h"
#include "checkpoint/torch_blob.h"
#include "tdist/error.h"

namespace tdist::checkpoint::detail {
namespace {

namespace fs = std::filesystem;
using Kind = PyValue::Kind;

const std::string kParamGroupsPrefix = "optim.param_groups.";

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char* kFilesystemModule = "torch.distributed.checkpoint.filesystem";
constexpr const char* kDCPVersion = "1.0.0";  // FileSystemWriter's CURRENT_DCP_VERSION

struct DtypeSpelling {
  const char* tdist;
  const char* torch;
};
constexpr DtypeSpelling kDtypes[] = {
    {"F32", "float32"}, {"F64", "float64"}, {"F16", "float16"}, {"BF16", "bfloat16"},
    {"I64", "int64"},   {"I32", "int32"},   {"I16", "int16"},   {"I8", "int8"},
    {"U8", "uint8"},    {"BOOL", "bool"},
};

// ---------------------------------------------------------------- writing

const char* torch_dtype(const std::string& tdist_name) {
  for (const auto& d : kDtypes) {
    if (tdist_name == d.tdist) return d.torch;
  }
  TDIST_THROW(CheckpointError, "checkpoint: dtype " + tdist_name + " has no torch name");
}

void write_size(PickleWriter& w, const std::vector<int64_t>& values) {
  w.global("torch", "Size");
  w.begin_call();
  w.begin_tuple();
  for (int64_t v : values) w.integer(v);
  w.end_tuple();
  w.end_call();
}

void write_properties(PickleWriter& w, const std::string& dtype) {
  // TensorProperties.__setstate__ takes (dtype, layout, requires_grad, memory format
  // encoding, pin_memory).
  w.begin_object(kMetadataModule, "TensorProperties");
  w.begin_tuple();
  w.global("torch", torch_dtype(dtype));
  w.global("torch.serialization", "_get_layout");  // how torch pickles torch.strided
  w.begin_call();
  w.str("torch.strided");
  w.end_call();
  w.boolean(false);
  w.global(kMetadataModule, "_MEM_FORMAT_ENCODING");
  w.begin_call();
  w.integer(0);  // TORCH_CONTIGUOUS_FORMAT
  w.end_call();
  w.boolean(false);
  w.end_tuple();
  w.end_object();
}

void write_tensor_metadata(PickleWriter& w, const TensorInfo& info) {
  w.begin_object(kMetadataModule, "TensorStorageMetadata");
  w.begin_dict();
  w.str("properties");
  write_properties(w, info.dtype);
  w.str("size");
  write_size(w, info.global_shape);
  w.str("chunks");
  w.begin_list();
  for (const auto& c : info.chunks) {
    w.begin_object(kMetadataModule, "ChunkStorageMetadata");
    w.begin_dict();
    w.str("offsets");
    write_size(w, c.offsets);
    w.str("sizes");
    write_size(w, c.sizes);
    w.end_dict();
    w.end_object();
  }
  w.end_list();
  w.end_dict();
  w.end_object();
}

void write_empty_object(PickleWriter& w, const char* name) {
  w.begin_object(kMetadataModule, name);
  w.begin_dict();
  w.end_dict();
  w.end_object();
}

void write_index(PickleWriter& w, const std::string& fqn, const std::vector<int64_t>* offsets,
                 int64_t index) {
  w.begin_object(kMetadataModule, "MetadataIndex");
  w.begin_dict();
  w.str("fqn");
  w.str(fqn);
  w.str("offset");
  if (offsets != nullptr) {
    write_size(w, *offsets);
  } else {
    w.none();
  }
  w.str("index");
  if (index >= 0) {
    w.integer(index);
  } else {
    w.none();
  }
  w.end_dict();
  w.end_object();
}

void write_storage_info(PickleWriter& w, const std::string& file, int64_t offset, int64_t length) {
  w.begin_object(kFilesystemModule, "_StorageInfo");
  w.begin_dict();
  w.str("relative_path");
  w.str(file);
  w.str("offset");
  w.integer(offset);
  w.str("length");
  w.integer(length);
  w.end_dict();
  w.end_object();
}

void write_storage_meta(PickleWriter& w, const std::string& checkpoint_id,
                        const std::string& save_id) {
  w.begin_object(kMetadataModule, "StorageMeta");
  w.begin_dict();
  w.str("checkpoint_id");
  w.str(checkpoint_id);
  w.str("save_id");
  w.str(save_id);
  w.str("load_id");
  w.none();
  w.str("modules");
  w.begin_list();
  w.end_list();
  w.end_dict();
  w.end_object();
}

// ---------------------------------------------------------------- reading

bool allowed_global(const std::string& name) {
  static const std::set<std::string> kAllowed = [] {
    std::set<std::string> s;
    for (const char* cls :
         {"Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
          "BytesStorageMetadata", "StorageMeta", "MetadataIndex", "_MEM_FORMAT_ENCODING"}) {
      s.insert(std::string(kMetadataModule) + "." + cls);
    }
    s.insert(std::string(kFilesystemModule) + "._StorageInfo");
    s.insert(std::string(kFilesystemModule) + "._StoragePrefix");
    // PyTorch 2.0-2.1 kept TensorProperties with the sharded tensor.
    s.insert("torch.distributed._shard.sharded_tensor.metadata.TensorProperties");
    s.insert("torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING");
    for (const char* g : {"torch.Size", "torch.serialization._get_layout",
                          "collections.OrderedDict", "pathlib.PosixPath", "pathlib.WindowsPath",
                          "pathlib._local.PosixPath", "pathlib._local.WindowsPath", "uuid.UUID"}) {
      s.insert(g);
    }
    for (const char* dtype : {"float32",         "float64",
                              "float16",         "bfloat16",
                              "int64",           "int32",
                              "int16",           "int8",
                              "uint8",           "bool",
                              "complex64",       "complex128",
                              "uint16",          "uint32",
                              "uint64",          "float8_e4m3fn",
                              "float8_e5m2",     "float8_e4m3fnuz",
                              "float8_e5m2fnuz", "qint8",
                              "quint8",          "qint32"}) {
      s.insert(std::string("torch.") + dtype);
    }
    return s;
  }();
  return kAllowed.count(name) > 0;
}

class MetadataDecoder {
 public:
  MetadataDecoder(std::string dir, std::string path)
      : dir_(std::move(dir)), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& why) const {
    TDIST_THROW(CheckpointError, "checkpoint: '" + path_ +
                                     "' is not a distributed checkpoint's "
                                     "metadata tdist understands (" +
                                     why + ")");
  }

  const PyValue& require(const PyRef& v, Kind kind, const std::string& what) const {
    if (!v || !v->is(kind)) fail(what + " is missing or of another type");
    return *v;
  }

  bool is_class(const PyRef& v, const std::string& short_name) const {
    if (!v || !v->is(Kind::kObject)) return false;
    const std::string& q = v->text;
    return q.size() > short_name.size() &&
           q.compare(q.size() - short_name.size() - 1, std::string::npos, "." + short_name) == 0;
  }

  std::vector<int64_t> sizes_of(const PyRef& v, const std::string& what) const {
    const PyValue* tuple = v.get();
    if (tuple && tuple->is(Kind::kObject) && tuple->text == "torch.Size" &&
        tuple->items.size() == 1) {
      tuple = tuple->items[0].get();
    }
    if (!tuple || !(tuple->is(Kind::kTuple) || tuple->is(Kind::kList))) {
      fail(what + " is not a torch.Size");
    }
    std::vector<int64_t> out;
    for (const auto& item : tuple->items) {
      out.push_back(require(item, Kind::kInt, what + "'s element").integer);
    }
    return out;
  }

  /// Elements of a shape from the file: every extent at least 0, the count within int64.
  int64_t element_count(const std::vector<int64_t>& sizes, const std::string& what) const {
    int64_t numel = 1;
    for (const int64_t s : sizes) {
      if (s < 0 || __builtin_mul_overflow(numel, s, &numel)) {
        fail(what + " is not a valid size");
      }
    }
    return numel;
  }

  std::string dtype_of(const PyRef& properties, const std::string& name) const {
    if (!is_class(properties, "TensorProperties")) fail("'" + name + "' has no TensorProperties");
    PyRef dtype;
    const PyRef& state = properties->state;
    if (state && state->is(Kind::kTuple) && !state->items.empty()) {
      dtype = state->items[0];  // __getstate__'s tuple, dtype first
    } else {
      dtype = properties->get("dtype");
    }
    if (!dtype || !dtype->is(Kind::kGlobal)) fail("'" + name + "' has no dtype");
    for (const auto& d : kDtypes) {
      if (dtype->text == std::string("torch.") + d.torch) return d.tdist;
    }
    TDIST_THROW(CheckpointError, "checkpoint: '" + name + "' in '" + path_ + "' is " + dtype->text +
                                     ", a dtype tdist checkpoints do not carry");
  }

  CheckpointMetadata decode(const PyRef& root) {
    if (!is_class(root, "Metadata")) {
      fail("its root object is " +
           (root && root->is(Kind::kObject) ? root->text : "not an object"));
    }
    index_storage(require(root->get("storage_data"), Kind::kDict, "storage_data"));
    CheckpointMetadata out;
    out.format = CheckpointFormat::kDCP;
    for (const auto& [key, md] :
         require(root->get("state_dict_metadata"), Kind::kDict, "state_dict_metadata").entries) {
      const std::string name = require(key, Kind::kStr, "a state_dict_metadata key").text;
      if (is_class(md, "TensorStorageMetadata")) {
        out.tensors[name] = tensor_info(name, md);
      } else if (is_class(md, "BytesStorageMetadata")) {
        if (name == kDCPExtraStateKey) {
          extra_state_ = find_storage(name, nullptr);
        } else if (name.compare(0, kParamGroupsPrefix.size(), kParamGroupsPrefix) == 0) {
          param_group_values_.push_back({name, find_storage(name, nullptr)});
        }
      } else {
        fail("'" + name + "' is described by " + (md && md->is(Kind::kObject) ? md->text : "?"));
      }
    }
    for (const auto& file : files_) out.files[file] = file_info(file);
    return out;
  }

  const std::optional<DCPByteEntry>& extra_state() const { return extra_state_; }
  const std::vector<DCPObjectEntry>& param_group_values() const { return param_group_values_; }

 private:
  void index_storage(const PyValue& storage) {
    for (const auto& [key, info] : storage.entries) {
      if (!is_class(key, "MetadataIndex") || !is_class(info, "_StorageInfo")) {
        fail("storage_data holds something other than MetadataIndex -> _StorageInfo");
      }
      const std::string fqn = require(key->get("fqn"), Kind::kStr, "MetadataIndex.fqn").text;
      const PyRef offset = key->get("offset");
      std::vector<int64_t> offsets;
      const bool has_offset = offset && !offset->is(Kind::kNone);
      if (has_offset) offsets = sizes_of(offset, "the offset of '" + fqn + "'");
      if (PyRef t = info->get("transform_descriptors");
          t && !t->is(Kind::kNone) && !t->items.empty()) {
        TDIST_THROW(CheckpointError,
                    "checkpoint: '" + fqn + "' in '" + path_ +
                        "' was saved through storage transforms (extensions such as compression), "
                        "which tdist does not read; save without extensions");
      }
      DCPByteEntry entry{require(info->get("relative_path"), Kind::kStr, "relative_path").text,
                         require(info->get("offset"), Kind::kInt, "offset").integer,
                         require(info->get("length"), Kind::kInt, "length").integer};
      if (entry.offset < 0 || entry.length < 0) {
        fail("the storage of '" + fqn + "' has a negative offset or length");
      }
      storage_[{fqn, has_offset ? offsets : std::vector<int64_t>{-1}}] = entry;
    }
  }

  DCPByteEntry find_storage(const std::string& fqn, const std::vector<int64_t>* offsets) {
    auto it = storage_.find({fqn, offsets ? *offsets : std::vector<int64_t>{-1}});
    if (it == storage_.end()) fail("no storage entry for a chunk of '" + fqn + "'");
    files_.insert(it->second.file);
    return it->second;
  }

  TensorInfo tensor_info(const std::string& name, const PyRef& md) {
    TensorInfo info;
    info.dtype = dtype_of(md->get("properties"), name);
    info.global_shape = sizes_of(md->get("size"), "the size of '" + name + "'");
    element_count(info.global_shape, "the size of '" + name + "'");
    for (const auto& chunk : require(md->get("chunks"), Kind::kList, "chunks of " + name).items) {
      if (!is_class(chunk, "ChunkStorageMetadata"))
        fail("a chunk of '" + name + "' is not a chunk");
      ChunkInfo c;
      c.offsets = sizes_of(chunk->get("offsets"), "a chunk offset of '" + name + "'");
      c.sizes = sizes_of(chunk->get("sizes"), "a chunk size of '" + name + "'");
      if (c.offsets.size() != info.global_shape.size() || c.sizes.size() != c.offsets.size()) {
        fail("a chunk of '" + name + "' has another rank than the tensor");
      }
      const int64_t numel = element_count(c.sizes, "a chunk size of '" + name + "'");
      for (size_t d = 0; d < c.sizes.size(); ++d) {
        if (c.offsets[d] < 0 || c.offsets[d] > info.global_shape[d] - c.sizes[d]) {
          fail("a chunk of '" + name + "' lies outside the tensor");
        }
      }
      if (numel == 0) continue;  // an empty shard has nothing to read
      const DCPByteEntry where = find_storage(name, &c.offsets);
      c.file = where.file;
      c.byte_offset = where.offset;
      c.byte_length = where.length;
      info.chunks.push_back(std::move(c));
    }
    return info;
  }

  FileInfo file_info(const std::string& file) const {
    FileInfo f;
    std::error_code ec;
    const auto size = fs::file_size(fs::path(dir_) / file, ec);
    f.size = ec ? -1 : static_cast<int64_t>(size);  // missing: the reader names the file
    f.block_bytes = 0;
    int rank = -1, part = -1;
    if (std::sscanf(file.c_str(), "__%d_%d", &rank, &part) == 2) f.rank = rank;
    return f;
  }

  std::string dir_, path_;
  std::map<std::pair<std::string, std::vector<int64_t>>, DCPByteEntry> storage_;
  std::set<std::string> files_;
  std::optional<DCPByteEntry> extra_state_;
  std::vector<DCPObjectEntry> param_group_values_;
};

/// The ExtraState list tdist stored beside the tensors.
std::vector<ExtraState> read_extra_state(const std::string& dir, const DCPByteEntry& entry) {
  const std::string path = (fs::path(dir) / entry.file).string();
  InputFile in(path);
  if (entry.offset < 0 || entry.length < 0 || entry.offset + entry.length > in.size()) {
    TDIST_THROW(CheckpointError, "checkpoint: the extra state of '" + dir + "' lies outside '" +
                                     path + "'; the checkpoint is truncated or corrupt");
  }
  std::string bytes(static_cast<size_t>(entry.length), '\0');
  in.read_at(entry.offset, bytes.data(), entry.length);
  const c10::IValue value =
      torch_load_bytes(bytes.data(), bytes.size(), "the extra state in '" + path + "'");
  std::vector<ExtraState> out;
  try {
    for (const auto& j : nlohmann::json::parse(value.toStringRef())) {
      out.push_back(ExtraState::from_json(j));
    }
  } catch (const std::exception& e) {
    TDIST_THROW(CheckpointError,
                "checkpoint: the extra state in '" + path + "' is corrupt (" + e.what() + ")");
  }
  return out;
}

/// A value Python torch.save'd into a param group (float, int, bool, None, str, and tuples
/// or lists of them) as JSON; nullopt for anything else (a key tdist then ignores).
std::optional<nlohmann::json> json_of(const c10::IValue& v) {
  if (v.isNone()) return nlohmann::json(nullptr);
  if (v.isBool()) return nlohmann::json(v.toBool());
  if (v.isInt()) return nlohmann::json(v.toInt());
  if (v.isDouble()) return nlohmann::json(v.toDouble());
  if (v.isString()) return nlohmann::json(v.toStringRef());
  if (v.isTuple() || v.isList()) {
    nlohmann::json out = nlohmann::json::array();
    const auto items = v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec();
    for (const auto& item : items) {
      auto j = json_of(item);
      if (!j) return std::nullopt;
      out.push_back(std::move(*j));
    }
    return out;
  }
  return std::nullopt;
}

/// Python's param groups from their flattened entries ("optim.param_groups.<i>.<key>").
nlohmann::json read_param_groups(const std::string& dir,
                                 const std::vector<DCPObjectEntry>& entries) {
  std::map<size_t, nlohmann::json> groups;
  for (const auto& [name, where] : entries) {
    const std::string rest = name.substr(kParamGroupsPrefix.size());
    const auto dot = rest.find('.');
    const std::string index = rest.substr(0, dot);
    if (dot == std::string::npos || index.empty() ||
        index.find_first_not_of("0123456789") != std::string::npos || index.size() > 6) {
      continue;  // not a group's option
    }
    const std::string path = (fs::path(dir) / where.file).string();
    InputFile in(path);
    if (where.offset + where.length > in.size()) {
      TDIST_THROW(CheckpointError, "checkpoint: '" + name + "' of '" + dir + "' lies outside '" +
                                       path + "'; the checkpoint is truncated or corrupt");
    }
    std::string bytes(static_cast<size_t>(where.length), '\0');
    in.read_at(where.offset, bytes.data(), where.length);
    const auto value = json_of(torch_load_bytes(bytes.data(), bytes.size(), "'" + name + "'"));
    auto& group = groups[std::stoul(index)];
    if (group.is_null()) group = nlohmann::json::object();
    if (value) group[rest.substr(dot + 1)] = *value;
  }
  nlohmann::json out = nlohmann::json::array();
  for (auto& [index, group] : groups) {
    if (index != out.size()) {
      TDIST_THROW(CheckpointError, "checkpoint: '" + dir + "' has optimizer param group " +
                                       std::to_string(index) + " but not group " +
                                       std::to_string(out.size()));
    }
    out.push_back(std::move(group));
  }
  return out;
}

/// Python's DDP names its parameters "module.<fqn>" in a raw state_dict(); tdist's names
/// are the wrapped module's, as get_model_state_dict gives them.
void strip_ddp_prefix(std::map<std::string, TensorInfo>* tensors) {
  const std::string model = "model.", ddp = "model.module.";
  bool any = false;
  for (const auto& [name, info] : *tensors) {
    if (name.compare(0, model.size(), model) != 0) continue;
    if (name.compare(0, ddp.size(), ddp) != 0) return;
    any = true;
  }
  if (!any) return;
  std::map<std::string, TensorInfo> renamed;
  for (auto& [name, info] : *tensors) {
    const bool wrapped = name.compare(0, ddp.size(), ddp) == 0;
    renamed[wrapped ? model + name.substr(ddp.size()) : name] = std::move(info);
  }
  *tensors = std::move(renamed);
}

}  // namespace

std::vector<std::string> dcp_state_dict_path(const std::string& name) {
  const std::string model = "model.", optim = "optim.state.";
  if (name.compare(0, model.size(), model) == 0 && name.size() > model.size()) {
    return {"model", name.substr(model.size())};
  }
  if (name.compare(0, optim.size(), optim) == 0) {
    const std::string rest = name.substr(optim.size());
    const auto dot = rest.rfind('.');
    if (dot != std::string::npos && dot > 0) {
      return {"optim", "state", rest.substr(0, dot), rest.substr(dot + 1)};
    }
  }
  return {name};
}

std::vector<std::pair<std::string, c10::IValue>> dcp_param_group_values(
    const nlohmann::json& groups) {
  std::function<c10::IValue(const nlohmann::json&)> ivalue_of = [&](const nlohmann::json& j) {
    if (j.is_null()) return c10::IValue();
    if (j.is_boolean()) return c10::IValue(j.get<bool>());
    if (j.is_number_integer()) return c10::IValue(j.get<int64_t>());
    if (j.is_number()) return c10::IValue(j.get<double>());
    if (j.is_string()) return c10::IValue(j.get<std::string>());
    if (j.is_array() &&
        std::all_of(j.begin(), j.end(), [](const auto& e) { return e.is_string(); })) {
      return c10::IValue(j.get<std::vector<std::string>>());  // "params": a list, as Python's
    }
    if (j.is_array()) {
      std::vector<c10::IValue> items;
      for (const auto& e : j) items.push_back(ivalue_of(e));
      return c10::IValue(c10::ivalue::Tuple::create(std::move(items)));  // betas: a tuple
    }
    TDIST_THROW(InvalidArgument, "checkpoint: a param group option is " + j.dump() +
                                     "; options are numbers, booleans, strings, null or lists");
  };
  std::vector<std::pair<std::string, c10::IValue>> out;
  if (!groups.is_array()) return out;
  for (size_t i = 0; i < groups.size(); ++i) {
    for (const auto& [key, value] : groups[i].items()) {
      out.emplace_back(kParamGroupsPrefix + std::to_string(i) + "." + key, ivalue_of(value));
    }
  }
  return out;
}

std::string encode_dcp_metadata(const CheckpointMetadata& metadata,
                                const std::optional<DCPByteEntry>& extra_state,
                                const std::vector<DCPObjectEntry>& objects,
                                const std::string& checkpoint_id, const std::string& save_id) {
  PickleWriter w;
  w.begin_object(kMetadataModule, "Metadata");
  w.begin_dict();

  w.str("state_dict_metadata");
  w.begin_dict();
  for (const auto& [name, info] : metadata.tensors) {
    w.str(name);
    write_tensor_metadata(w, info);
  }
  if (extra_state) {
    w.str(kDCPExtraStateKey);
    write_empty_object(w, "BytesStorageMetadata");
  }
  for (const auto& o : objects) {
    w.str(o.name);
    write_empty_object(w, "BytesStorageMetadata");
  }
  w.end_dict();

  // Python's flatten_state_dict mapping: dcp_to_torch_save and _load_state_dict_from_keys
  // rebuild the nested dict from it.
  w.str("planner_data");
  w.begin_dict();
  for (const auto& [name, info] : metadata.tensors) {
    w.str(name);
    w.begin_tuple();
    for (const auto& part : dcp_state_dict_path(name)) w.str(part);
    w.end_tuple();
  }
  if (extra_state) {
    w.str(kDCPExtraStateKey);
    w.begin_tuple();
    w.str(kDCPExtraStateKey);
    w.end_tuple();
  }
  for (const auto& o : objects) {  // ("optim", "param_groups", <i>, <key>): the index an int
    const std::string rest = o.name.substr(kParamGroupsPrefix.size());
    const auto dot = rest.find('.');
    w.str(o.name);
    w.begin_tuple();
    w.str("optim");
    w.str("param_groups");
    w.integer(std::stoll(rest.substr(0, dot)));
    w.str(rest.substr(dot + 1));
    w.end_tuple();
  }
  w.end_dict();

  w.str("storage_data");
  w.begin_dict();
  for (const auto& [name, info] : metadata.tensors) {
    for (size_t i = 0; i < info.chunks.size(); ++i) {
      const ChunkInfo& c = info.chunks[i];
      write_index(w, name, &c.offsets, static_cast<int64_t>(i));
      write_storage_info(w, c.file, c.byte_offset, c.byte_length);
    }
  }
  if (extra_state) {
    write_index(w, kDCPExtraStateKey, nullptr, -1);
    write_storage_info(w, extra_state->file, extra_state->offset, extra_state->length);
  }
  for (const auto& o : objects) {
    write_index(w, o.name, nullptr, -1);
    write_storage_info(w, o.where.file, o.where.offset, o.where.length);
  }
  w.end_dict();

  w.str("storage_meta");
  write_storage_meta(w, checkpoint_id, save_id);
  w.str("version");
  w.str(kDCPVersion);

  w.end_dict();
  w.end_object();
  return w.finish();
}

CheckpointMetadata read_dcp_metadata(const std::string& dir) {
  const std::string path = (fs::path(dir) / kDCPMetadataFile).string();
  const PyRef root = unpickle(read_whole_file(path), allowed_global, path);
  MetadataDecoder decoder(dir, path);
  CheckpointMetadata metadata = decoder.decode(root);
  strip_ddp_prefix(&metadata.tensors);
  int max_rank = -1;
  for (const auto& [file, info] : metadata.files) max_rank = std::max(max_rank, info.rank);
  if (decoder.extra_state()) {
    metadata.extra_per_rank = read_extra_state(dir, *decoder.extra_state());
    metadata.world_size = static_cast<int>(metadata.extra_per_rank.size());
  } else {
    metadata.world_size = max_rank + 1;  // ranks that wrote nothing leave no file: a floor
    if (!decoder.param_group_values().empty()) {
      ExtraState python;
      python.optimizer_param_groups = read_param_groups(dir, decoder.param_group_values());
      metadata.extra_per_rank = {python};
    }
  }
  return metadata;
}

}  // namespace tdist::checkpoint::detail

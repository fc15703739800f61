#include "tdist/comm/object.h"

#include <cstring>

#include <torch/torch.h>

#include "tdist/error.h"

// Note [Object wire format]
// "TDOB" magic, one version byte, then one value:
//   tag u8: 0 null | 1 bool (u8 0/1) | 2 int (i64) | 3 double (f64) | 4 string (u64 len, bytes)
//           5 tensor (u8 dtype code, u8 ndim, ndim x i64 dims, u64 nbytes, raw bytes)
//           6 list (u64 count, values) | 7 dict (u64 count, count x (string key, value))
// Integers are little-endian. Nothing in the format names code to run; the reader checks
// every length against the bytes left before allocating, and nesting against kMaxDepth.

namespace tdist {

namespace {

constexpr char kMagic[4] = {'T', 'D', 'O', 'B'};
constexpr uint8_t kVersion = 1;
constexpr int kMaxDepth = 100;
constexpr int kMaxDims = 32;

enum Tag : uint8_t { kNull, kBool, kInt, kDouble, kString, kTensor, kList, kDict };

const std::vector<c10::ScalarType>& dtype_codes() {
  static const std::vector<c10::ScalarType> codes{c10::ScalarType::Float, c10::ScalarType::Double,
                                                  c10::ScalarType::Half,  c10::ScalarType::BFloat16,
                                                  c10::ScalarType::Byte,  c10::ScalarType::Char,
                                                  c10::ScalarType::Short, c10::ScalarType::Int,
                                                  c10::ScalarType::Long,  c10::ScalarType::Bool};
  return codes;
}

class Writer {
 public:
  std::vector<uint8_t> out;
  void u8(uint8_t v) { out.push_back(v); }
  template <typename T>
  void raw(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.insert(out.end(), b, b + sizeof(T));
  }
  void bytes(const void* p, size_t n) {
    auto* c = static_cast<const uint8_t*>(p);
    out.insert(out.end(), c, c + n);
  }
  void str(const std::string& s) {
    raw<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }

  void value(const Object& v, int depth) {
    if (depth > kMaxDepth) {
      TDIST_THROW(InvalidArgument,
                  "serialize_object: nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    switch (v.kind()) {
      case Object::Kind::kNull:
        u8(kNull);
        break;
      case Object::Kind::kBool:
        u8(kBool);
        u8(v.as_bool() ? 1 : 0);
        break;
      case Object::Kind::kInt:
        u8(kInt);
        raw<int64_t>(v.as_int());
        break;
      case Object::Kind::kDouble:
        u8(kDouble);
        raw<double>(v.as_double());
        break;
      case Object::Kind::kString:
        u8(kString);
        str(v.as_string());
        break;
      case Object::Kind::kTensor:
        tensor(v.as_tensor());
        break;
      case Object::Kind::kList:
        u8(kList);
        raw<uint64_t>(v.as_list().size());
        for (const auto& item : v.as_list()) value(item, depth + 1);
        break;
      case Object::Kind::kDict:
        u8(kDict);
        raw<uint64_t>(v.as_dict().size());
        for (const auto& [key, item] : v.as_dict()) {
          str(key);
          value(item, depth + 1);
        }
        break;
    }
  }

  void tensor(const at::Tensor& t) {
    TDIST_CHECK_ARG(t.defined(), "serialize_object: an undefined tensor cannot be sent");
    const auto& codes = dtype_codes();
    auto it = std::find(codes.begin(), codes.end(), t.scalar_type());
    TDIST_CHECK_ARG(it != codes.end(), std::string("serialize_object: tensors of dtype ") +
                                           c10::toString(t.scalar_type()) + " are not supported");
    TDIST_CHECK_ARG(t.dim() <= kMaxDims, "serialize_object: tensor has more than " +
                                             std::to_string(kMaxDims) + " dimensions");
    at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
    u8(kTensor);
    u8(static_cast<uint8_t>(it - codes.begin()));
    u8(static_cast<uint8_t>(cpu.dim()));
    for (int64_t d : cpu.sizes()) raw<int64_t>(d);
    uint64_t nbytes = cpu.numel() * cpu.element_size();
    raw<uint64_t>(nbytes);
    bytes(cpu.data_ptr(), nbytes);
  }
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}

  [[noreturn]] void fail(const std::string& why) const {
    TDIST_THROW(InvalidArgument, "deserialize_object: corrupt or foreign data at byte " +
                                     std::to_string(offset()) + ": " + why);
  }
  size_t offset() const { return static_cast<size_t>(p_ - begin_); }
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  void need(size_t n, const char* what) const {
    if (n > left()) {
      fail(std::string("truncated ") + what + " (needs " + std::to_string(n) + " bytes, " +
           std::to_string(left()) + " left)");
    }
  }
  uint8_t u8(const char* what) {
    need(1, what);
    return *p_++;
  }
  template <typename T>
  T raw(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    uint64_t n = raw<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }

  Object document() {
    begin_ = p_;
    need(5, "header");
    if (std::memcmp(p_, kMagic, 4) != 0) fail("missing 'TDOB' magic (not a tdist object)");
    p_ += 4;
    uint8_t version = *p_++;
    if (version != kVersion) {
      fail("unsupported format version " + std::to_string(version) + " (expected " +
           std::to_string(kVersion) + ")");
    }
    Object v = value(0);
    if (left() != 0) fail(std::to_string(left()) + " trailing bytes after the value");
    return v;
  }

  Object value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    uint8_t tag = u8("tag");
    switch (tag) {
      case kNull:
        return Object();
      case kBool: {
        uint8_t b = u8("bool");
        if (b > 1) fail("bool byte " + std::to_string(b) + " is neither 0 nor 1");
        return Object(b == 1);
      }
      case kInt:
        return Object(raw<int64_t>("int"));
      case kDouble:
        return Object(raw<double>("double"));
      case kString:
        return Object(str("string"));
      case kTensor:
        return Object(tensor());
      case kList: {
        uint64_t n = raw<uint64_t>("list length");
        if (n > left()) fail("list length " + std::to_string(n) + " exceeds the bytes left");
        Object::List list;
        list.reserve(n);
        for (uint64_t i = 0; i < n; ++i) list.push_back(value(depth + 1));
        return Object(std::move(list));
      }
      case kDict: {
        uint64_t n = raw<uint64_t>("dict size");
        if (n > left()) fail("dict size " + std::to_string(n) + " exceeds the bytes left");
        Object::Dict dict;
        for (uint64_t i = 0; i < n; ++i) {
          std::string key = str("dict key");
          if (dict.count(key)) fail("dict key '" + key + "' appears twice");
          dict.emplace(std::move(key), value(depth + 1));
        }
        return Object(std::move(dict));
      }
      default:
        fail("unknown tag " + std::to_string(tag));
    }
  }

  at::Tensor tensor() {
    uint8_t code = u8("tensor dtype");
    const auto& codes = dtype_codes();
    if (code >= codes.size()) fail("unknown tensor dtype code " + std::to_string(code));
    uint8_t ndim = u8("tensor rank");
    if (ndim > kMaxDims) fail("tensor rank " + std::to_string(ndim) + " is too large");
    std::vector<int64_t> dims(ndim);
    uint64_t numel = 1;
    for (auto& d : dims) {
      d = raw<int64_t>("tensor dims");
      if (d < 0) fail("negative tensor dimension " + std::to_string(d));
      if (d != 0 && numel > (uint64_t(1) << 62) / static_cast<uint64_t>(d)) {
        fail("tensor dimensions overflow");
      }
      numel *= static_cast<uint64_t>(d);
    }
    uint64_t nbytes = raw<uint64_t>("tensor byte count");
    auto options = at::TensorOptions().dtype(codes[code]);
    uint64_t expected = numel * c10::elementSize(codes[code]);
    if (nbytes != expected) {
      fail("tensor byte count " + std::to_string(nbytes) + " does not match its shape (" +
           std::to_string(expected) + ")");
    }
    need(nbytes, "tensor data");
    at::Tensor t = at::empty(dims, options);
    if (nbytes) std::memcpy(t.data_ptr(), p_, nbytes);
    if (codes[code] == c10::ScalarType::Bool) {
      for (uint64_t i = 0; i < nbytes; ++i) {
        if (p_[i] > 1) fail("bool tensor element is neither 0 nor 1");
      }
    }
    p_ += nbytes;
    return t;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  const uint8_t* begin_ = nullptr;
};

const char* kind_text(Object::Kind k) {
  static const char* names[] = {"null",   "bool",   "int",  "double",
                                "string", "tensor", "list", "dict"};
  return names[static_cast<int>(k)];
}

}  // namespace

std::string Object::kind_name() const {
  return kind_text(kind());
}

#define TDIST_OBJECT_GET(kind_enum, type)                                                        \
  if (kind() != Kind::kind_enum) {                                                               \
    TDIST_THROW(InvalidArgument, std::string("Object: expected ") + kind_text(Kind::kind_enum) + \
                                     " but it holds " + kind_name());                            \
  }                                                                                              \
  return std::get<type>(value_)

bool Object::as_bool() const {
  TDIST_OBJECT_GET(kBool, bool);
}
int64_t Object::as_int() const {
  TDIST_OBJECT_GET(kInt, int64_t);
}
double Object::as_double() const {
  TDIST_OBJECT_GET(kDouble, double);
}
const std::string& Object::as_string() const {
  TDIST_OBJECT_GET(kString, std::string);
}
const at::Tensor& Object::as_tensor() const {
  TDIST_OBJECT_GET(kTensor, at::Tensor);
}
const Object::List& Object::as_list() const {
  TDIST_OBJECT_GET(kList, List);
}
Object::List& Object::as_list() {
  TDIST_OBJECT_GET(kList, List);
}
const Object::Dict& Object::as_dict() const {
  TDIST_OBJECT_GET(kDict, Dict);
}
Object::Dict& Object::as_dict() {
  TDIST_OBJECT_GET(kDict, Dict);
}
#undef TDIST_OBJECT_GET

const Object& Object::at(const std::string& key) const {
  const auto& dict = as_dict();
  auto it = dict.find(key);
  TDIST_CHECK_ARG(it != dict.end(), "Object: the dict has no key '" + key + "'");
  return it->second;
}

bool Object::operator==(const Object& other) const {
  if (kind() != other.kind()) return false;
  if (kind() == Kind::kTensor) {
    const auto& a = as_tensor();
    const auto& b = other.as_tensor();
    if (!a.defined() || !b.defined()) return a.defined() == b.defined();
    return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
           a.to(at::kCPU).equal(b.to(at::kCPU));
  }
  switch (kind()) {
    case Kind::kNull:
      return true;
    case Kind::kBool:
      return as_bool() == other.as_bool();
    case Kind::kInt:
      return as_int() == other.as_int();
    case Kind::kDouble:
      return as_double() == other.as_double();
    case Kind::kString:
      return as_string() == other.as_string();
    case Kind::kList:
      return as_list() == other.as_list();
    case Kind::kDict:
      return as_dict() == other.as_dict();
    default:
      return false;
  }
}

std::vector<uint8_t> serialize_object(const Object& value) {
  Writer w;
  w.bytes(kMagic, 4);
  w.u8(kVersion);
  w.value(value, 0);
  return std::move(w.out);
}

Object deserialize_object(const uint8_t* data, size_t size) {
  TDIST_CHECK_ARG(data != nullptr || size == 0, "deserialize_object: null data");
  Reader r(data, size);
  return r.document();
}

}  // namespace tdist

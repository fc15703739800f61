#pragma once

// A plain-data value for the object collectives (broadcast_object_list, all_gather_object,
// ...): null, bool, int64, double, string, tensor, list or string-keyed dict of these.
// Serialized to a tagged binary format that only describes data (never code), parsed
// strictly: anything malformed raises InvalidArgument instead of being guessed at.

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tdist {

class Object {
 public:
  using List = std::vector<Object>;
  using Dict = std::map<std::string, Object>;
  enum class Kind { kNull, kBool, kInt, kDouble, kString, kTensor, kList, kDict };

  Object() = default;
  /*implicit*/ Object(std::nullptr_t) {}
  /*implicit*/ Object(bool v) : value_(v) {}
  /*implicit*/ Object(int v) : value_(static_cast<int64_t>(v)) {}
  /*implicit*/ Object(int64_t v) : value_(v) {}
  /*implicit*/ Object(double v) : value_(v) {}
  /*implicit*/ Object(const char* v) : value_(std::string(v)) {}
  /*implicit*/ Object(std::string v) : value_(std::move(v)) {}
  /*implicit*/ Object(at::Tensor v) : value_(std::move(v)) {}
  /*implicit*/ Object(List v) : value_(std::move(v)) {}
  /*implicit*/ Object(Dict v) : value_(std::move(v)) {}

  Kind kind() const { return static_cast<Kind>(value_.index()); }
  /// "null", "bool", "int", "double", "string", "tensor", "list", "dict".
  std::string kind_name() const;
  bool is_null() const { return kind() == Kind::kNull; }

  // Accessors throw InvalidArgument naming the actual kind on a mismatch.
  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;
  const std::string& as_string() const;
  const at::Tensor& as_tensor() const;
  const List& as_list() const;
  List& as_list();
  const Dict& as_dict() const;
  Dict& as_dict();
  /// Dict member; throws if this is not a dict or the key is absent.
  const Object& at(const std::string& key) const;

  /// Deep equality; tensors compare by dtype, shape and values.
  bool operator==(const Object& other) const;
  bool operator!=(const Object& other) const { return !(*this == other); }

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, at::Tensor, List, Dict> value_;
};

/// Bytes describing `value` (tensors are copied from any device as contiguous CPU data).
std::vector<uint8_t> serialize_object(const Object& value);
/// Parses bytes made by serialize_object. Throws InvalidArgument on anything malformed:
/// bad magic or version, unknown tag, truncation, trailing bytes, excessive nesting,
/// sizes that do not add up. Tensors come back on the CPU.
Object deserialize_object(const uint8_t* data, size_t size);
inline Object deserialize_object(const std::vector<uint8_t>& bytes) {
  return deserialize_object(bytes.data(), bytes.size());
}

}  // namespace tdist

#include "checkpoint/dtype.h"

#include "tdist/error.h"

namespace tdist::checkpoint::detail {
namespace {

struct Entry {
  c10::ScalarType type;
  const char* name;
};
constexpr Entry kTable[] = {
    {c10::kFloat, "F32"}, {c10::kDouble, "F64"}, {c10::kHalf, "F16"},  {c10::kBFloat16, "BF16"},
    {c10::kLong, "I64"},  {c10::kInt, "I32"},    {c10::kShort, "I16"}, {c10::kChar, "I8"},
    {c10::kByte, "U8"},   {c10::kBool, "BOOL"},
};

}  // namespace

std::string dtype_name(c10::ScalarType type) {
  for (const auto& e : kTable) {
    if (e.type == type) return e.name;
  }
  TDIST_THROW(CheckpointError, std::string("checkpoint: dtype ") + c10::toString(type) +
                                   " cannot be saved; convert the tensor to a real dtype first");
}

c10::ScalarType dtype_from_name(const std::string& name, const std::string& where) {
  for (const auto& e : kTable) {
    if (name == e.name) return e.type;
  }
  TDIST_THROW(CheckpointError,
              "checkpoint: unknown dtype '" + name + "' in " + where + "; the file is corrupt");
}

}  // namespace tdist::checkpoint::detail

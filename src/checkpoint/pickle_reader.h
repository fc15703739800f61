#pragma once

// A Python pickle read as data, never as code: globals are looked up in an allow-list and
// calls (REDUCE, NEWOBJ) and BUILD only record what they would have done, so a pickle can
// describe objects but not run anything. Used for the `.metadata` of PyTorch's distributed
// checkpoints (pickled dataclasses).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tdist::checkpoint::detail {

struct PyValue;
using PyRef = std::shared_ptr<PyValue>;

struct PyValue {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kStr,
    kBytes,
    kTuple,
    kList,
    kDict,
    kGlobal,
    kObject
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  /// kStr / kBytes: the contents; kGlobal / kObject: "module.name" of the global / class.
  std::string text;
  /// kTuple / kList: the elements; kObject: the arguments of its construction.
  std::vector<PyRef> items;
  /// kDict: in insertion order (keys may be objects).
  std::vector<std::pair<PyRef, PyRef>> entries;
  /// kObject: what BUILD gave it (a dict for most dataclasses), null if nothing.
  PyRef state;

  bool is(Kind k) const { return kind == k; }
  /// kDict with string keys, kObject's dict state: the value under `key`, null if absent.
  PyRef get(const std::string& key) const;
};

/// Calls `visit` once on every value reachable from `roots`, each shared value once
/// (iteratively: deep nesting does not exhaust the stack).
void for_each_reachable(const std::vector<PyRef>& roots,
                        const std::function<void(const PyValue&)>& visit);

/// Decides which "module.name" globals a pickle may name.
using GlobalFilter = std::function<bool(const std::string& qualified_name)>;

/// Reads one pickle (protocols 2-5). `where` names the file in errors. Throws
/// CheckpointError for a truncated or malformed pickle, an opcode outside what Python's
/// pickler emits for plain data, or a global the filter refuses (naming it).
PyRef unpickle(const std::string& bytes, const GlobalFilter& allowed, const std::string& where);

}  // namespace tdist::checkpoint::detail

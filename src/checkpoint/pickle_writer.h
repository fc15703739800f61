#pragma once

// Emits a protocol-2 Python pickle one opcode at a time, for the `.metadata` of PyTorch's
// distributed checkpoints: enough to describe dataclasses, dicts, tuples and scalars. The
// caller states the structure (begin/end pairs), as Python's pickler would emit it.

#include <cstdint>
#include <string>

#include "checkpoint/pickle_opcodes.h"

namespace tdist::checkpoint::detail {

class PickleWriter {
 public:
  PickleWriter();

  void none();
  void boolean(bool value);
  void integer(int64_t value);
  void real(double value);
  void str(const std::string& value);
  /// A module-level name, e.g. global("torch", "float32").
  void global(const std::string& module, const std::string& name);

  /// MARK ... TUPLE: the values written in between.
  void begin_tuple();
  void end_tuple();
  /// Empty list/dict, then MARK ... APPENDS/SETITEMS (a dict's entries as key, value, ...).
  void begin_list();
  void end_list();
  void begin_dict();
  void end_dict();

  /// `module.name()` then BUILD with the state written between begin and end, as Python
  /// pickles a dataclass instance (copyreg.__newobj__ with no arguments).
  void begin_object(const std::string& module, const std::string& name);
  void end_object();
  /// `callable(*args)`: write the callable (global), then the args between the two calls.
  void begin_call();
  void end_call();

  /// STOP; the finished pickle.
  std::string finish();

 private:
  void op(PickleOp code) { out_.push_back(static_cast<char>(code)); }
  void little_endian(uint64_t v, int bytes);

  std::string out_;
};

}  // namespace tdist::checkpoint::detail

#include "checkpoint/pickle_writer.h"

#include <cstring>

namespace tdist::checkpoint::detail {

PickleWriter::PickleWriter() {
  op('\x80');  // PROTO 2: NEWOBJ and the short binary opcodes
  op('\x02');
}

void PickleWriter::little_endian(uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PickleWriter::none() {
  op('N');
}

void PickleWriter::boolean(bool value) {
  op(value ? '\x88' : '\x89');
}

void PickleWriter::integer(int64_t value) {
  if (value >= 0 && value < 256) {
    op('K');
    little_endian(static_cast<uint64_t>(value), 1);
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    op('J');
    little_endian(static_cast<uint32_t>(static_cast<int32_t>(value)), 4);
  } else {
    op('\x8a');  // LONG1: 8 bytes, two's complement
    out_.push_back(8);
    little_endian(static_cast<uint64_t>(value), 8);
  }
}

void PickleWriter::real(double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, 8);
  op('G');
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void PickleWriter::str(const std::string& value) {
  op('X');  // BINUNICODE: UTF-8 with a 4-byte length
  little_endian(value.size(), 4);
  out_ += value;
}

void PickleWriter::global(const std::string& module, const std::string& name) {
  op('c');
  out_ += module + "\n" + name + "\n";
}

void PickleWriter::begin_tuple() {
  op('(');
}
void PickleWriter::end_tuple() {
  op('t');
}

void PickleWriter::begin_list() {
  op(']');
  op('(');
}
void PickleWriter::end_list() {
  op('e');
}

void PickleWriter::begin_dict() {
  op('}');
  op('(');
}
void PickleWriter::end_dict() {
  op('u');
}

void PickleWriter::begin_object(const std::string& module, const std::string& name) {
  global(module, name);
  op(')');     // no arguments
  op('\x81');  // NEWOBJ: cls.__new__(cls)
}
void PickleWriter::end_object() {
  op('b');
}  // BUILD with the state just written

void PickleWriter::begin_call() {
  op('(');
}
void PickleWriter::end_call() {
  op('t');
  op('R');  // REDUCE
}

std::string PickleWriter::finish() {
  op('.');
  return std::move(out_);
}

}  // namespace tdist::checkpoint::detail

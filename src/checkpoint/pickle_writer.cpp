#include "checkpoint/pickle_writer.h"

#include <cstring>

namespace tdist::checkpoint::detail {

PickleWriter::PickleWriter() {
  op(kProto);  // protocol 2: NEWOBJ and the short binary opcodes
  out_.push_back(2);
}

void PickleWriter::little_endian(uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PickleWriter::none() {
  op(kNone);
}

void PickleWriter::boolean(bool value) {
  op(value ? kNewTrue : kNewFalse);
}

void PickleWriter::integer(int64_t value) {
  if (value >= 0 && value < 256) {
    op(kBinInt1);
    little_endian(static_cast<uint64_t>(value), 1);
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    op(kBinInt);
    little_endian(static_cast<uint32_t>(static_cast<int32_t>(value)), 4);
  } else {
    op(kLong1);  // 8 bytes, two's complement
    out_.push_back(8);
    little_endian(static_cast<uint64_t>(value), 8);
  }
}

void PickleWriter::real(double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, 8);
  op(kBinFloat);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void PickleWriter::str(const std::string& value) {
  op(kBinUnicode);  // UTF-8 with a 4-byte length
  little_endian(value.size(), 4);
  out_ += value;
}

void PickleWriter::global(const std::string& module, const std::string& name) {
  op(kGlobal);
  out_ += module + "\n" + name + "\n";
}

void PickleWriter::begin_tuple() {
  op(kMark);
}
void PickleWriter::end_tuple() {
  op(kTuple);
}

void PickleWriter::begin_list() {
  op(kEmptyList);
  op(kMark);
}
void PickleWriter::end_list() {
  op(kAppends);
}

void PickleWriter::begin_dict() {
  op(kEmptyDict);
  op(kMark);
}
void PickleWriter::end_dict() {
  op(kSetItems);
}

void PickleWriter::begin_object(const std::string& module, const std::string& name) {
  global(module, name);
  op(kEmptyTuple);  // no arguments
  op(kNewObj);      // cls.__new__(cls)
}
// BUILD with the state written since begin_object.
void PickleWriter::end_object() {
  op(kBuild);
}

void PickleWriter::begin_call() {
  op(kMark);
}
void PickleWriter::end_call() {
  op(kTuple);
  op(kReduce);
}

std::string PickleWriter::finish() {
  op(kStop);
  return std::move(out_);
}

}  // namespace tdist::checkpoint::detail

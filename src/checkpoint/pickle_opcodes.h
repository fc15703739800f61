#pragma once

// The Python pickle opcodes (Lib/pickletools.py names) that pickle_reader reads and
// pickle_writer writes: protocols 2-5 for plain data, plus the text memo ops of protocol 0.

#include <cstdint>

namespace tdist::checkpoint::detail {

enum PickleOp : uint8_t {
  kProto = 0x80,
  kFrame = 0x95,
  kStop = '.',
  kMark = '(',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kNone = 'N',
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kBinInt = 'J',
  kBinInt1 = 'K',
  kBinInt2 = 'M',
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  kBinFloat = 'G',
  kShortBinUnicode = 0x8c,
  kBinUnicode = 'X',
  kBinUnicode8 = 0x8d,
  kShortBinBytes = 'C',
  kBinBytes = 'B',
  kBinBytes8 = 0x8e,
  kEmptyTuple = ')',
  kTuple = 't',
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kEmptyList = ']',
  kList = 'l',
  kAppend = 'a',
  kAppends = 'e',
  kEmptySet = 0x8f,
  kAddItems = 0x90,
  kFrozenSet = 0x91,
  kEmptyDict = '}',
  kDict = 'd',
  kSetItem = 's',
  kSetItems = 'u',
  kGlobal = 'c',
  kStackGlobal = 0x93,
  kReduce = 'R',
  kNewObj = 0x81,
  kNewObjEx = 0x92,
  kBuild = 'b',
  kMemoize = 0x94,
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kGet = 'g',
  kBinGet = 'h',
  kLongBinGet = 'j',
};

}  // namespace tdist::checkpoint::detail

#include "checkpoint/pickle_reader.h"

#include <cstring>
#include <map>
#include <unordered_set>

#include "checkpoint/pickle_opcodes.h"
#include "tdist/error.h"

namespace tdist::checkpoint::detail {
namespace {

using Kind = PyValue::Kind;

PyRef make(Kind kind) {
  auto v = std::make_shared<PyValue>();
  v->kind = kind;
  return v;
}

PyRef make_int(int64_t i) {
  PyRef v = make(Kind::kInt);
  v->integer = i;
  return v;
}

PyRef make_text(Kind kind, std::string text) {
  PyRef v = make(kind);
  v->text = std::move(text);
  return v;
}

/// The pickle virtual machine, restricted to data: see pickle_reader.h.
class Unpickler {
 public:
  Unpickler(const std::string& bytes, const GlobalFilter& allowed, const std::string& where)
      : bytes_(bytes), allowed_(allowed), where_(where) {}

  PyRef run() {
    while (true) {
      const uint8_t op = byte();
      if (op == kStop) break;
      step(op);
    }
    if (stack_.size() != 1 || !marks_.empty()) fail("it does not end with one value");
    return stack_.back();
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    TDIST_THROW(CheckpointError, "checkpoint: '" + where_ + "' is not a pickle tdist can read (" +
                                     why + ", at byte " + std::to_string(pos_) + ")");
  }

  const char* take(size_t n) {
    if (n > bytes_.size() - pos_) fail("it ends early");
    const char* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint8_t byte() { return static_cast<uint8_t>(*take(1)); }
  uint64_t little_endian(size_t n) {
    const auto* p = reinterpret_cast<const uint8_t*>(take(n));
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
  }
  std::string line() {
    const size_t end = bytes_.find('\n', pos_);
    if (end == std::string::npos) fail("it ends early, in a text argument");
    std::string s = bytes_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  std::string counted(size_t length_bytes) {
    const uint64_t n = little_endian(length_bytes);
    if (n > bytes_.size()) fail("a length is larger than the file");
    return std::string(take(static_cast<size_t>(n)), static_cast<size_t>(n));
  }

  uint64_t decimal(const std::string& text) {
    if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
      fail("a memo index is not a number");
    }
    // Digit by digit: std::stoull would throw std::out_of_range, not a CheckpointError.
    uint64_t value = 0;
    for (char c : text) {
      const uint64_t digit = static_cast<uint64_t>(c - '0');
      if (value > (UINT64_MAX - digit) / 10) fail("a memo index is out of range");
      value = value * 10 + digit;
    }
    return value;
  }

  void push(PyRef v) { stack_.push_back(std::move(v)); }
  PyRef pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      fail("the stack is empty");
    }
    PyRef v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PyRef& top() {
    if (stack_.empty()) fail("the stack is empty");
    return stack_.back();
  }
  /// The values above the newest mark, removed from the stack with the mark.
  std::vector<PyRef> pop_to_mark() {
    if (marks_.empty()) fail("no mark");
    const size_t at = marks_.back();
    marks_.pop_back();
    std::vector<PyRef> items(stack_.begin() + static_cast<std::ptrdiff_t>(at), stack_.end());
    stack_.resize(at);
    return items;
  }

  PyRef tuple(std::vector<PyRef> items) {
    PyRef t = make(Kind::kTuple);
    t->items = std::move(items);
    return t;
  }
  PyRef global(const std::string& module, const std::string& name) {
    const std::string qualified = module + "." + name;
    if (!allowed_(qualified)) fail("it names the global " + qualified + ", which is not allowed");
    return make_text(Kind::kGlobal, qualified);
  }
  /// A call of `callable` with `args`, recorded instead of made.
  PyRef object(const PyRef& callable, const PyRef& args) {
    if (!callable->is(Kind::kGlobal)) fail("it calls something that is not a global");
    if (!args->is(Kind::kTuple)) fail("call arguments are not a tuple");
    PyRef o = make_text(Kind::kObject, callable->text);
    o->items = args->items;
    return o;
  }
  // Note [No cycles]: Python's pickler can write a container that holds itself; PyValues are
  // reference-counted, so such a value would never be freed, and every reader of it would
  // loop. Checkpoint metadata never holds one, so inserting a value that reaches its new
  // container is refused.
  void refuse_cycle(const PyValue* container, const std::vector<PyRef>& values) {
    for_each_reachable(values, [&](const PyValue& v) {
      if (&v == container) fail("a container holds itself, which checkpoint data never does");
    });
  }
  void set_items(PyRef& dict, const std::vector<PyRef>& kv) {
    if (!dict->is(Kind::kDict) || kv.size() % 2 != 0) fail("SETITEMS outside a dict");
    refuse_cycle(dict.get(), kv);
    for (size_t i = 0; i < kv.size(); i += 2) dict->entries.emplace_back(kv[i], kv[i + 1]);
  }
  void append(PyRef& list, const std::vector<PyRef>& items) {
    if (!list->is(Kind::kList)) fail("APPENDS outside a list");
    refuse_cycle(list.get(), items);
    list->items.insert(list->items.end(), items.begin(), items.end());
  }
  void memo_put(uint64_t index) { memo_[index] = top(); }
  void memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end())
      fail("it refers to memo entry " + std::to_string(index) + " it never set");
    push(it->second);
  }
  PyRef long_int(size_t length_bytes) {
    const uint64_t n = little_endian(length_bytes);
    if (n > 8) fail("an integer wider than 64 bits");
    const auto* p = reinterpret_cast<const uint8_t*>(take(static_cast<size_t>(n)));
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t(p[i]) << (8 * i);
    if (n > 0 && n < 8 && (p[n - 1] & 0x80)) v |= ~uint64_t(0) << (8 * n);  // sign-extend
    return make_int(static_cast<int64_t>(v));
  }

  /// A new list of the values above the newest mark (LIST, FROZENSET: sets read as lists).
  PyRef list_from_mark() {
    PyRef l = make(Kind::kList);
    l->items = pop_to_mark();
    return l;
  }

  void step(uint8_t op) {
    switch (op) {
      case kProto:
        byte();
        break;
      case kFrame:  // a hint: the bytes follow inline
        little_endian(8);
        break;
      case kMark:
        marks_.push_back(stack_.size());
        break;
      case kPop:
        pop();
        break;
      case kPopMark:
        pop_to_mark();
        break;
      case kDup:
        push(top());
        break;
      case kNone:
        push(make(Kind::kNone));
        break;
      case kNewTrue:
      case kNewFalse: {
        PyRef b = make(Kind::kBool);
        b->boolean = op == kNewTrue;
        push(b);
        break;
      }
      case kBinInt:
        push(make_int(static_cast<int32_t>(little_endian(4))));
        break;
      case kBinInt1:
        push(make_int(static_cast<int64_t>(little_endian(1))));
        break;
      case kBinInt2:
        push(make_int(static_cast<int64_t>(little_endian(2))));
        break;
      case kLong1:
        push(long_int(1));
        break;
      case kLong4:
        push(long_int(4));
        break;
      case kBinFloat: {  // a big-endian double
        const auto* p = reinterpret_cast<const uint8_t*>(take(8));
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];
        PyRef f = make(Kind::kFloat);
        std::memcpy(&f->real, &bits, 8);
        push(f);
        break;
      }
      case kShortBinUnicode:
        push(make_text(Kind::kStr, counted(1)));
        break;
      case kBinUnicode:
        push(make_text(Kind::kStr, counted(4)));
        break;
      case kBinUnicode8:
        push(make_text(Kind::kStr, counted(8)));
        break;
      case kShortBinBytes:
        push(make_text(Kind::kBytes, counted(1)));
        break;
      case kBinBytes:
        push(make_text(Kind::kBytes, counted(4)));
        break;
      case kBinBytes8:
        push(make_text(Kind::kBytes, counted(8)));
        break;
      case kEmptyTuple:
        push(tuple({}));
        break;
      case kTuple:
        push(tuple(pop_to_mark()));
        break;
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        std::vector<PyRef> items(op - kTuple1 + 1);
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        push(tuple(std::move(items)));
        break;
      }
      case kEmptyList:
      case kEmptySet:
        push(make(Kind::kList));
        break;
      case kList:
      case kFrozenSet:
        push(list_from_mark());
        break;
      case kAppend: {
        PyRef v = pop();
        append(top(), {v});
        break;
      }
      case kAppends:
      case kAddItems: {
        auto items = pop_to_mark();
        append(top(), items);
        break;
      }
      case kEmptyDict:
        push(make(Kind::kDict));
        break;
      case kDict: {
        PyRef d = make(Kind::kDict);
        set_items(d, pop_to_mark());
        push(d);
        break;
      }
      case kSetItem: {
        PyRef value = pop();
        PyRef key = pop();
        set_items(top(), {key, value});
        break;
      }
      case kSetItems: {
        auto kv = pop_to_mark();
        set_items(top(), kv);
        break;
      }
      case kGlobal: {
        const std::string module = line();
        push(global(module, line()));
        break;
      }
      case kStackGlobal: {
        PyRef name = pop();
        PyRef module = pop();
        if (!module->is(Kind::kStr) || !name->is(Kind::kStr)) fail("STACK_GLOBAL of non-strings");
        push(global(module->text, name->text));
        break;
      }
      case kReduce:
      case kNewObj: {
        PyRef args = pop();
        PyRef callable = pop();
        push(object(callable, args));
        break;
      }
      case kNewObjEx: {
        PyRef kwargs = pop();
        PyRef args = pop();
        PyRef cls = pop();
        PyRef o = object(cls, args);
        if (kwargs->is(Kind::kDict) && !kwargs->entries.empty()) o->state = kwargs;
        push(o);
        break;
      }
      case kBuild: {
        PyRef state = pop();
        PyRef& target = top();
        if (!target->is(Kind::kObject)) fail("BUILD of something that is not an object");
        refuse_cycle(target.get(), {state});
        target->state = state;
        break;
      }
      case kMemoize:
        memo_put(memo_.size());
        break;
      case kBinPut:
        memo_put(little_endian(1));
        break;
      case kLongBinPut:
        memo_put(little_endian(4));
        break;
      case kPut:
        memo_put(decimal(line()));
        break;
      case kBinGet:
        memo_get(little_endian(1));
        break;
      case kLongBinGet:
        memo_get(little_endian(4));
        break;
      case kGet:
        memo_get(decimal(line()));
        break;
      default: {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02x", op);
        fail(std::string("opcode ") + hex + " is not one Python's pickler emits for plain data");
      }
    }
  }

  const std::string& bytes_;
  const GlobalFilter& allowed_;
  const std::string& where_;
  size_t pos_ = 0;
  std::vector<PyRef> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, PyRef> memo_;
};

}  // namespace

PyRef PyValue::get(const std::string& key) const {
  const PyValue* dict = this;
  if (kind == Kind::kObject) {
    if (!state) return nullptr;
    dict = state.get();
    // A dataclass with __slots__ pickles its state as (dict or None, slots dict).
    if (dict->is(Kind::kTuple) && dict->items.size() == 2) {
      for (const auto& part : dict->items) {
        if (part->is(Kind::kDict)) {
          if (PyRef v = part->get(key)) return v;
        }
      }
      return nullptr;
    }
  }
  if (!dict->is(Kind::kDict)) return nullptr;
  for (const auto& [k, v] : dict->entries) {
    if (k->is(Kind::kStr) && k->text == key) return v;
  }
  return nullptr;
}

void for_each_reachable(const std::vector<PyRef>& roots,
                        const std::function<void(const PyValue&)>& visit) {
  std::unordered_set<const PyValue*> seen;
  std::vector<const PyValue*> pending;
  for (const auto& root : roots) pending.push_back(root.get());
  while (!pending.empty()) {
    const PyValue* v = pending.back();
    pending.pop_back();
    if (v == nullptr || !seen.insert(v).second) continue;
    visit(*v);
    for (const auto& item : v->items) pending.push_back(item.get());
    for (const auto& [key, value] : v->entries) {
      pending.push_back(key.get());
      pending.push_back(value.get());
    }
    pending.push_back(v->state.get());
  }
}

PyRef unpickle(const std::string& bytes, const GlobalFilter& allowed, const std::string& where) {
  return Unpickler(bytes, allowed, where).run();
}

}  // namespace tdist::checkpoint::detail

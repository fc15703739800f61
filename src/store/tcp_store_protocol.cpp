#include "store/tcp_store_protocol.h"

#include <algorithm>
#include <cstring>

namespace tdist::detail::store_proto {

void put_u64(uint64_t v, std::vector<uint8_t>* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
void put_u32(uint32_t v, std::vector<uint8_t>* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

uint64_t max_body_bytes(uint8_t op, const Limits& limits) {
  const uint64_t key = 4 + static_cast<uint64_t>(limits.max_key_bytes);
  const uint64_t value = 8 + static_cast<uint64_t>(limits.max_value_bytes);
  switch (static_cast<Op>(op)) {
    case Op::kAuth:
      return kNonceBytes + kMacBytes;
    case Op::kSet:
      return key + value;
    case Op::kGet:
      return key + 8;
    case Op::kAdd:
      return key + 8;
    case Op::kCompareSet:
      return key + 2 * value;
    case Op::kCheck:
      return 4 + static_cast<uint64_t>(limits.max_keys) * key;
    case Op::kDelete:
      return key;
    case Op::kNumKeys:
      return 0;
    case Op::kWait:
    case Op::kMultiGet:
      return 4 + static_cast<uint64_t>(limits.max_keys) * key + 8;
    case Op::kAppend:
    case Op::kQueuePush:
      return key + value;
    case Op::kMultiSet:
      // Every key with its length prefix, the values' length prefixes, one value's bytes.
      return 4 + static_cast<uint64_t>(limits.max_keys) * (key + 8) + limits.max_value_bytes;
    case Op::kQueuePop:
      return key + 8;
    case Op::kQueueLen:
      return key;
  }
  return 0;
}

uint64_t max_reply_bytes(const Request& request, const Limits& limits) {
  // Error replies carry a message; leave room for one beside a value.
  constexpr uint64_t kSlack = 64 * 1024;
  const uint64_t value = 8 + static_cast<uint64_t>(limits.max_value_bytes);
  if (request.op == Op::kMultiGet) return 4 + request.keys.size() * value + kSlack;
  // A timed-out wait names its missing keys.
  return std::max<uint64_t>(value, limits.max_keys * (limits.max_key_bytes + 2)) + kSlack;
}

std::vector<uint8_t> encode_values(const std::vector<const std::vector<uint8_t>*>& values) {
  std::vector<uint8_t> out;
  put_u32(static_cast<uint32_t>(values.size()), &out);
  for (const auto* v : values) {
    put_u64(v->size(), &out);
    out.insert(out.end(), v->begin(), v->end());
  }
  return out;
}

bool parse_values(const std::vector<uint8_t>& body, size_t count,
                  std::vector<std::vector<uint8_t>>* out) {
  if (body.size() < 4 || get_u32(body.data()) != count) return false;
  size_t pos = 4;
  out->clear();
  out->reserve(count);
  for (size_t i = 0; i < count; ++i) {
    if (body.size() - pos < 8) return false;
    const uint64_t n = get_u64(body.data() + pos);
    pos += 8;
    if (body.size() - pos < n) return false;
    out->emplace_back(body.begin() + static_cast<std::ptrdiff_t>(pos),
                      body.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
  }
  return pos == body.size();
}

namespace {

// Reads fields from a body whose full length is already known to be present.
class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  bool u64(uint64_t* v) {
    if (size_ - pos_ < 8) return fail("truncated integer");
    *v = get_u64(data_ + pos_);
    pos_ += 8;
    return true;
  }
  bool u32(uint32_t* v) {
    if (size_ - pos_ < 4) return fail("truncated count");
    *v = get_u32(data_ + pos_);
    pos_ += 4;
    return true;
  }
  bool key(size_t max, std::string* out) {
    uint32_t n;
    if (!u32(&n)) return false;
    if (n > max) return fail("key of " + std::to_string(n) + " bytes over the limit");
    if (size_ - pos_ < n) return fail("truncated key");
    out->assign(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return true;
  }
  bool value(size_t max, std::vector<uint8_t>* out) {
    uint64_t n;
    if (!u64(&n)) return false;
    if (n > max) return fail("value of " + std::to_string(n) + " bytes over the limit");
    if (size_ - pos_ < n) return fail("truncated value");
    out->assign(data_ + pos_, data_ + pos_ + n);
    pos_ += n;
    return true;
  }
  bool raw(uint64_t n, std::vector<uint8_t>* out) {
    if (size_ - pos_ < n) return fail("truncated field");
    out->assign(data_ + pos_, data_ + pos_ + n);
    pos_ += n;
    return true;
  }
  bool done() {
    if (pos_ != size_) return fail(std::to_string(size_ - pos_) + " trailing bytes");
    return true;
  }
  const std::string& error() const { return error_; }

 private:
  bool fail(std::string why) {
    error_ = std::move(why);
    return false;
  }
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string error_;
};

bool parse_body(Op op, Reader& r, const Limits& limits, Request* out) {
  out->keys.clear();
  out->value.clear();
  out->expected.clear();
  out->values.clear();
  out->number = 0;
  uint64_t number = 0;
  auto one_key = [&] {
    out->keys.emplace_back();
    return r.key(limits.max_key_bytes, &out->keys.back());
  };
  switch (op) {
    case Op::kAuth:
      return r.raw(kNonceBytes + kMacBytes, &out->value) && r.done();
    case Op::kSet:
      return one_key() && r.value(limits.max_value_bytes, &out->value) && r.done();
    case Op::kGet:
    case Op::kAdd:
    case Op::kQueuePop:
      if (!one_key() || !r.u64(&number)) return false;
      out->number = static_cast<int64_t>(number);
      return r.done();
    case Op::kCompareSet:
      return one_key() && r.value(limits.max_value_bytes, &out->expected) &&
             r.value(limits.max_value_bytes, &out->value) && r.done();
    case Op::kDelete:
    case Op::kQueueLen:
      return one_key() && r.done();
    case Op::kAppend:
    case Op::kQueuePush:
      return one_key() && r.value(limits.max_value_bytes, &out->value) && r.done();
    case Op::kMultiSet: {
      uint32_t n;
      if (!r.u32(&n)) return false;
      if (n > limits.max_keys) return false;
      uint64_t total = 0;
      for (uint32_t i = 0; i < n; ++i) {
        out->values.emplace_back();
        if (!one_key() || !r.value(limits.max_value_bytes - total, &out->values.back())) {
          return false;
        }
        total += out->values.back().size();
      }
      return r.done();
    }
    case Op::kNumKeys:
      return r.done();
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet: {
      uint32_t n;
      if (!r.u32(&n)) return false;
      if (n > limits.max_keys) {
        out->keys.clear();
        return false;
      }
      for (uint32_t i = 0; i < n; ++i) {
        if (!one_key()) return false;
      }
      if (op != Op::kCheck) {
        if (!r.u64(&number)) return false;
        out->number = static_cast<int64_t>(number);
      }
      return r.done();
    }
  }
  return false;
}

}  // namespace

ParseResult parse_request(const uint8_t* data, size_t size, const Limits& limits, Request* out) {
  ParseResult result;
  if (size < 1) return result;
  const uint8_t op = data[0];
  const uint64_t limit = max_body_bytes(op, limits);
  if (limit == 0 && static_cast<Op>(op) != Op::kNumKeys) {
    result.status = ParseStatus::kMalformed;
    result.error = "unknown request type " + std::to_string(op);
    return result;
  }
  if (size < kFrameHeaderBytes) return result;
  const uint64_t length = get_u64(data + 1);
  if (length > limit) {
    result.status = ParseStatus::kMalformed;
    result.error = "request body of " + std::to_string(length) + " bytes over the limit of " +
                   std::to_string(limit);
    return result;
  }
  if (size - kFrameHeaderBytes < length) return result;
  out->op = static_cast<Op>(op);
  Reader reader(data + kFrameHeaderBytes, length);
  if (!parse_body(out->op, reader, limits, out)) {
    result.status = ParseStatus::kMalformed;
    result.error = reader.error().empty() ? "too many keys" : reader.error();
    return result;
  }
  result.status = ParseStatus::kOk;
  result.consumed = kFrameHeaderBytes + length;
  return result;
}

namespace {
void put_key(const std::string& key, std::vector<uint8_t>* out) {
  put_u32(static_cast<uint32_t>(key.size()), out);
  out->insert(out->end(), key.begin(), key.end());
}
void put_value(const std::vector<uint8_t>& value, std::vector<uint8_t>* out) {
  put_u64(value.size(), out);
  out->insert(out->end(), value.begin(), value.end());
}
}  // namespace

void encode_request(const Request& request, std::vector<uint8_t>* out) {
  std::vector<uint8_t> body;
  const std::string empty;
  const std::string& key = request.keys.empty() ? empty : request.keys.front();
  switch (request.op) {
    case Op::kAuth:
      body = request.value;
      break;
    case Op::kSet:
      put_key(key, &body);
      put_value(request.value, &body);
      break;
    case Op::kGet:
    case Op::kAdd:
    case Op::kQueuePop:
      put_key(key, &body);
      put_u64(static_cast<uint64_t>(request.number), &body);
      break;
    case Op::kAppend:
    case Op::kQueuePush:
      put_key(key, &body);
      put_value(request.value, &body);
      break;
    case Op::kQueueLen:
      put_key(key, &body);
      break;
    case Op::kMultiSet:
      put_u32(static_cast<uint32_t>(request.keys.size()), &body);
      for (size_t i = 0; i < request.keys.size(); ++i) {
        put_key(request.keys[i], &body);
        put_value(i < request.values.size() ? request.values[i] : std::vector<uint8_t>{}, &body);
      }
      break;
    case Op::kCompareSet:
      put_key(key, &body);
      put_value(request.expected, &body);
      put_value(request.value, &body);
      break;
    case Op::kDelete:
      put_key(key, &body);
      break;
    case Op::kNumKeys:
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      put_u32(static_cast<uint32_t>(request.keys.size()), &body);
      for (const auto& k : request.keys) put_key(k, &body);
      if (request.op != Op::kCheck) put_u64(static_cast<uint64_t>(request.number), &body);
      break;
  }
  out->push_back(static_cast<uint8_t>(request.op));
  put_u64(body.size(), out);
  out->insert(out->end(), body.begin(), body.end());
}

void encode_response(Status status, const uint8_t* body, size_t size, std::vector<uint8_t>* out) {
  out->push_back(static_cast<uint8_t>(status));
  put_u64(size, out);
  if (size > 0) out->insert(out->end(), body, body + size);
}

std::vector<uint8_t> encode_hello(bool auth_required, const uint8_t* nonce) {
  std::vector<uint8_t> out;
  put_u32(kMagic, &out);
  out.push_back(kVersion);
  out.push_back(auth_required ? 1 : 0);
  out.insert(out.end(), nonce, nonce + kNonceBytes);
  return out;
}

bool parse_hello(const uint8_t* data, bool* auth_required, std::vector<uint8_t>* nonce) {
  if (get_u32(data) != kMagic || data[4] != kVersion || data[5] > 1) return false;
  *auth_required = data[5] == 1;
  nonce->assign(data + 6, data + 6 + kNonceBytes);
  return true;
}

}  // namespace tdist::detail::store_proto

#pragma once

// The TCP store's wire protocol (see docs/security.md, "Wire protocol").
//
// On connect the server sends a fixed-size Hello (magic, version, whether authentication is
// required, a fresh random nonce). Then every request is one frame:
//   u8 op | u64 body length (little-endian) | body
// and every response is one frame:
//   u8 status | u64 body length | body.
// Strings inside a body are u32 length + bytes (keys) or u64 length + bytes (values). The
// parser is strict: an unknown op, a length over the limits, a count over the limits or a
// body with bytes left over is malformed, and the server closes that connection.
// parse_request is a pure function over a byte buffer so that fuzz/ can target it.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tdist::detail::store_proto {

constexpr uint32_t kMagic = 0x54445354;  // "TDST"
constexpr uint8_t kVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;  // HMAC-SHA256
constexpr size_t kHelloBytes = 4 + 1 + 1 + kNonceBytes;
constexpr size_t kFrameHeaderBytes = 1 + 8;

enum class Op : uint8_t {
  kAuth = 1,  // body: client nonce | HMAC(secret, server nonce || client nonce)
  kSet = 2,
  kGet = 3,  // body: key | i64 timeout ms (<= 0: none); the server parks the request
  kAdd = 4,
  kCompareSet = 5,
  kCheck = 6,
  kDelete = 7,
  kNumKeys = 8,
  kWait = 9,        // body: keys | i64 timeout ms
  kAppend = 10,     // body: key | value; reply empty
  kMultiGet = 11,   // body: keys | i64 timeout ms; parked like wait; reply: u32 n | n values
  kMultiSet = 12,   // body: u32 n | n x (key | value); all set in one step
  kQueuePush = 13,  // body: key | value
  kQueuePop = 14,   // body: key | i64 timeout ms (0: none, < 0: do not wait); reply: value
  kQueueLen = 15,   // body: key; reply: u64 length
};

enum class Status : uint8_t {
  kOk = 0,
  kTimeout = 1,  // body: the missing keys, comma separated (queue pop: its queue was empty)
  kError = 2,    // body: a message
};

struct Limits {
  size_t max_key_bytes = 4096;
  size_t max_value_bytes = 256 * 1024 * 1024;
  size_t max_keys = 1024;  // keys in one check/wait/multi_get/multi_set
  // A multi_set's values together are held to max_value_bytes, as one set's value is.
};

struct Request {
  Op op = Op::kNumKeys;
  // One for set/get/add/cas/delete/append/queue ops, several for check/wait/multi_get/
  // multi_set.
  std::vector<std::string> keys;
  std::vector<uint8_t> value;     // set/append/queue push: value; cas: desired; auth: nonce + mac
  std::vector<uint8_t> expected;  // cas
  std::vector<std::vector<uint8_t>> values;  // multi_set: one per key
  int64_t number = 0;  // add: amount; get/wait/multi_get/queue pop: timeout in ms
};

enum class ParseStatus { kOk, kNeedMore, kMalformed };

struct ParseResult {
  ParseStatus status = ParseStatus::kNeedMore;
  size_t consumed = 0;  // bytes of the frame when kOk
  std::string error;    // why, when kMalformed
};

/// Largest body a request of `op` may have under `limits`; 0 for an unknown op.
uint64_t max_body_bytes(uint8_t op, const Limits& limits);

/// Parses one request frame from the front of [data, data + size). Never reads past size,
/// never allocates more than the frame's (checked) length. kNeedMore: the frame is valid so
/// far but incomplete; kMalformed: the connection must be closed.
ParseResult parse_request(const uint8_t* data, size_t size, const Limits& limits, Request* out);

/// Appends the frame for `request` to out (the inverse of parse_request).
void encode_request(const Request& request, std::vector<uint8_t>* out);

/// Largest reply body a request may get under `limits` (the client refuses larger ones).
uint64_t max_reply_bytes(const Request& request, const Limits& limits);

/// A multi_get reply body: u32 count | count x (u64 length | bytes).
std::vector<uint8_t> encode_values(const std::vector<const std::vector<uint8_t>*>& values);
/// False if the body is not exactly `count` values.
bool parse_values(const std::vector<uint8_t>& body, size_t count,
                  std::vector<std::vector<uint8_t>>* out);

/// Appends a response frame.
void encode_response(Status status, const uint8_t* body, size_t size, std::vector<uint8_t>* out);

void put_u64(uint64_t v, std::vector<uint8_t>* out);
uint64_t get_u64(const uint8_t* p);
void put_u32(uint32_t v, std::vector<uint8_t>* out);
uint32_t get_u32(const uint8_t* p);

std::vector<uint8_t> encode_hello(bool auth_required, const uint8_t* nonce);
/// False if the bytes are not a tdist store hello of our version.
bool parse_hello(const uint8_t* data, bool* auth_required, std::vector<uint8_t>* nonce);

}  // namespace tdist::detail::store_proto

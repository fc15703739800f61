// libFuzzer target for the TCP store's request parser (src/store/tcp_store_protocol.cpp).
// Properties checked on every input, read as a stream of frames like the server reads it:
//  - the parser never reads past the buffer (AddressSanitizer) and never consumes more
//    than it was given;
//  - a frame it accepts re-encodes to exactly the bytes it consumed (the format is canonical,
//    so nothing in an accepted frame is ignored);
//  - nothing it accepts breaks the limits (a multi_set's values count together).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "store/tcp_store_protocol.h"

using namespace tdist::detail::store_proto;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Limits limits;
  limits.max_key_bytes = 64;
  limits.max_value_bytes = 4096;
  limits.max_keys = 16;
  size_t pos = 0;
  while (pos < size) {
    Request request;
    ParseResult result = parse_request(data + pos, size - pos, limits, &request);
    if (result.status != ParseStatus::kOk) break;
    if (result.consumed == 0 || result.consumed > size - pos) std::abort();
    if (request.keys.size() > limits.max_keys) std::abort();
    for (const auto& key : request.keys) {
      if (key.size() > limits.max_key_bytes) std::abort();
    }
    if (request.op != Op::kAuth && request.value.size() > limits.max_value_bytes) std::abort();
    // multi_set: one value per key, all of them together within one value's limit.
    if (request.op == Op::kMultiSet && request.values.size() != request.keys.size()) std::abort();
    if (request.op != Op::kMultiSet && !request.values.empty()) std::abort();
    size_t total = 0;
    for (const auto& value : request.values) total += value.size();
    if (total > limits.max_value_bytes) std::abort();
    std::vector<uint8_t> again;
    encode_request(request, &again);
    if (again.size() != result.consumed ||
        std::memcmp(again.data(), data + pos, again.size()) != 0) {
      std::abort();
    }
    pos += result.consumed;
  }
  if (size >= kHelloBytes) {
    bool auth = false;
    std::vector<uint8_t> nonce;
    if (parse_hello(data, &auth, &nonce) && nonce.size() != kNonceBytes) std::abort();
  }
  return 0;
}

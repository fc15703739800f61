// The store's wire parser on crafted input: it accepts what the encoder writes and rejects
// oversized, truncated, trailing or unknown frames without reading past the buffer.
#include <gtest/gtest.h>

#include <random>

#include "store/tcp_store_protocol.h"

namespace {

using namespace tdist::detail::store_proto;

std::vector<uint8_t> frame_of(const Request& r) {
  std::vector<uint8_t> out;
  encode_request(r, &out);
  return out;
}

TEST(StoreProtocol, RoundTripsEveryOp) {
  Limits limits;
  std::vector<Request> requests(9);
  requests[0].op = Op::kSet;
  requests[0].keys = {"k"};
  requests[0].value = {1, 2, 3};
  requests[1].op = Op::kGet;
  requests[1].keys = {"key"};
  requests[1].number = 1234;
  requests[2].op = Op::kAdd;
  requests[2].keys = {"c"};
  requests[2].number = -7;
  requests[3].op = Op::kCompareSet;
  requests[3].keys = {"x"};
  requests[3].expected = {9};
  requests[3].value = {8, 8};
  requests[4].op = Op::kCheck;
  requests[4].keys = {"a", "b", ""};
  requests[5].op = Op::kDelete;
  requests[5].keys = {"d"};
  requests[6].op = Op::kNumKeys;
  requests[7].op = Op::kWait;
  requests[7].keys = {"w1", "w2"};
  requests[7].number = 50;
  requests[8].op = Op::kAuth;
  requests[8].value.assign(kNonceBytes + kMacBytes, 0xab);
  Request r;
  r.op = Op::kAppend;
  r.keys = {"ap"};
  r.value = {4, 5};
  requests.push_back(r);
  r = Request();
  r.op = Op::kMultiGet;
  r.keys = {"m1", "", "m3"};
  r.number = 77;
  requests.push_back(r);
  r = Request();
  r.op = Op::kMultiSet;
  r.keys = {"s1", "s2"};
  r.values = {{1}, {}};
  requests.push_back(r);
  r = Request();
  r.op = Op::kQueuePush;
  r.keys = {"q"};
  r.value = {0, 1};
  requests.push_back(r);
  r = Request();
  r.op = Op::kQueuePop;
  r.keys = {"q"};
  r.number = -1;  // do not wait
  requests.push_back(r);
  r = Request();
  r.op = Op::kQueueLen;
  r.keys = {"q"};
  requests.push_back(r);
  for (const auto& r : requests) {
    auto bytes = frame_of(r);
    // Every strict prefix is incomplete, never malformed.
    for (size_t n = 0; n < bytes.size(); ++n) {
      Request out;
      EXPECT_EQ(parse_request(bytes.data(), n, limits, &out).status, ParseStatus::kNeedMore)
          << "op " << int(r.op) << " prefix " << n;
    }
    Request out;
    auto result = parse_request(bytes.data(), bytes.size(), limits, &out);
    ASSERT_EQ(result.status, ParseStatus::kOk) << result.error;
    EXPECT_EQ(result.consumed, bytes.size());
    EXPECT_EQ(out.op, r.op);
    EXPECT_EQ(out.keys, r.keys);
    EXPECT_EQ(out.value, r.value);
    EXPECT_EQ(out.expected, r.expected);
    EXPECT_EQ(out.values, r.values);
    EXPECT_EQ(out.number, r.number);
  }
}

TEST(StoreProtocol, MultiSetValuesTogetherAreHeldToTheValueLimit) {
  Limits limits;
  limits.max_value_bytes = 16;
  Request r;
  r.op = Op::kMultiSet;
  r.keys = {"a", "b"};
  r.values = {std::vector<uint8_t>(8, 1), std::vector<uint8_t>(8, 2)};
  auto bytes = frame_of(r);
  Request out;
  EXPECT_EQ(parse_request(bytes.data(), bytes.size(), limits, &out).status, ParseStatus::kOk);
  r.values[1].push_back(3);  // 17 bytes in all
  bytes = frame_of(r);
  EXPECT_EQ(parse_request(bytes.data(), bytes.size(), limits, &out).status,
            ParseStatus::kMalformed);
  limits.max_keys = 1;
  r.values[1].pop_back();
  bytes = frame_of(r);
  EXPECT_EQ(parse_request(bytes.data(), bytes.size(), limits, &out).status,
            ParseStatus::kMalformed);
}

TEST(StoreProtocol, MultiGetReplyRoundTripsAndRejectsWrongCounts) {
  const std::vector<uint8_t> a{1, 2}, b{}, c{3};
  auto body = encode_values({&a, &b, &c});
  std::vector<std::vector<uint8_t>> out;
  ASSERT_TRUE(parse_values(body, 3, &out));
  EXPECT_EQ(out, (std::vector<std::vector<uint8_t>>{a, b, c}));
  EXPECT_FALSE(parse_values(body, 2, &out));
  body.push_back(0);
  EXPECT_FALSE(parse_values(body, 3, &out));
  body.resize(body.size() - 2);
  EXPECT_FALSE(parse_values(body, 3, &out));
  EXPECT_FALSE(parse_values({}, 0, &out));
}

TEST(StoreProtocol, RejectsHugeLengthPrefixAtOnce) {
  std::vector<uint8_t> bytes{static_cast<uint8_t>(Op::kSet)};
  put_u64(uint64_t{1} << 63, &bytes);
  Request out;
  auto result = parse_request(bytes.data(), bytes.size(), Limits{}, &out);
  EXPECT_EQ(result.status, ParseStatus::kMalformed);
  EXPECT_NE(result.error.find("over the limit"), std::string::npos) << result.error;
}

TEST(StoreProtocol, RejectsHttpAndUnknownOps) {
  const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  Request out;
  auto result =
      parse_request(reinterpret_cast<const uint8_t*>(http.data()), http.size(), Limits{}, &out);
  EXPECT_EQ(result.status, ParseStatus::kMalformed);
  const uint8_t zero = 0;
  EXPECT_EQ(parse_request(&zero, 1, Limits{}, &out).status, ParseStatus::kMalformed);
}

TEST(StoreProtocol, RejectsOversizedKeyValueAndTrailingBytes) {
  Limits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 16;
  Request r;
  r.op = Op::kSet;
  r.keys = {std::string(9, 'k')};
  auto bytes = frame_of(r);
  Request out;
  EXPECT_EQ(parse_request(bytes.data(), bytes.size(), limits, &out).status,
            ParseStatus::kMalformed);
  r.keys = {"k"};
  r.value.assign(17, 1);
  bytes = frame_of(r);
  EXPECT_EQ(parse_request(bytes.data(), bytes.size(), limits, &out).status,
            ParseStatus::kMalformed);
  // A well-formed body with one byte too many, length adjusted to include it.
  r.value.assign(4, 1);
  bytes = frame_of(r);
  bytes.push_back(0);
  const uint64_t body = bytes.size() - kFrameHeaderBytes;
  for (int i = 0; i < 8; ++i) bytes[1 + i] = static_cast<uint8_t>(body >> (8 * i));
  auto result = parse_request(bytes.data(), bytes.size(), limits, &out);
  EXPECT_EQ(result.status, ParseStatus::kMalformed);
  EXPECT_NE(result.error.find("trailing"), std::string::npos) << result.error;
  // A key length inside the body pointing past the body.
  std::vector<uint8_t> lying{static_cast<uint8_t>(Op::kDelete)};
  put_u64(4, &lying);
  put_u32(7, &lying);
  EXPECT_EQ(parse_request(lying.data(), lying.size(), limits, &out).status,
            ParseStatus::kMalformed);
}

TEST(StoreProtocol, TooManyKeysIsMalformed) {
  Limits limits;
  limits.max_keys = 2;
  Request r;
  r.op = Op::kCheck;
  r.keys = {"a", "b", "c"};
  auto bytes = frame_of(r);
  Request out;
  EXPECT_EQ(parse_request(bytes.data(), bytes.size(), limits, &out).status,
            ParseStatus::kMalformed);
}

TEST(StoreProtocol, RandomBytesNeverCrashOrOverconsume) {
  std::mt19937 rng(1234);
  Limits limits;
  limits.max_value_bytes = 1024;
  int ok = 0, malformed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> bytes(rng() % 64);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    if (!bytes.empty() && i % 2 == 0) bytes[0] = static_cast<uint8_t>(1 + rng() % 15);
    Request out;
    auto result = parse_request(bytes.data(), bytes.size(), limits, &out);
    if (result.status == ParseStatus::kOk) {
      ++ok;
      EXPECT_LE(result.consumed, bytes.size());
    } else if (result.status == ParseStatus::kMalformed) {
      ++malformed;
    }
  }
  EXPECT_GT(malformed, 0);
}

TEST(StoreProtocol, HelloRoundTrip) {
  std::vector<uint8_t> nonce(kNonceBytes, 7);
  auto hello = encode_hello(true, nonce.data());
  ASSERT_EQ(hello.size(), kHelloBytes);
  bool auth = false;
  std::vector<uint8_t> got;
  ASSERT_TRUE(parse_hello(hello.data(), &auth, &got));
  EXPECT_TRUE(auth);
  EXPECT_EQ(got, nonce);
  hello[0] ^= 1;
  EXPECT_FALSE(parse_hello(hello.data(), &auth, &got));
}

}  // namespace

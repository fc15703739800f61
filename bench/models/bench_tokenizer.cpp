// Tokenizer encode and decode throughput on one thread, the C++ half of
// `run.sh --tokenizer` (tokenizer_bench.py is the Python `tokenizers` half).
//   bench_tokenizer TOKENIZER_JSON TEXT_FILE [ROUNDS]
// Prints one JSON line: tokens/s of encode (median round), MB/s, decode tokens/s, and a
// checksum of the ids so that both sides are seen to produce the same tokens.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tdist/models/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_tokenizer TOKENIZER_JSON TEXT_FILE [ROUNDS]\n");
    return 2;
  }
  const auto tok = tdist::models::Tokenizer::from_file(argv[1]);
  std::ifstream in(argv[2]);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
  std::vector<double> encode_s, decode_s;
  std::vector<int64_t> ids;
  for (int r = 0; r < rounds; ++r) {
    // A fresh tokenizer each round: no round starts with another's cache.
    const auto fresh = tdist::models::Tokenizer::from_file(argv[1]);
    auto start = std::chrono::steady_clock::now();
    ids = fresh.encode(text, false);
    encode_s.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    start = std::chrono::steady_clock::now();
    const std::string back = fresh.decode(ids);
    decode_s.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (back != text) {
      std::fprintf(stderr, "decode(encode(text)) != text\n");
      return 1;
    }
  }
  std::sort(encode_s.begin(), encode_s.end());
  std::sort(decode_s.begin(), decode_s.end());
  uint64_t checksum = 0;
  for (int64_t id : ids) checksum = checksum * 1000003u + static_cast<uint64_t>(id);
  const double e = encode_s[encode_s.size() / 2], d = decode_s[decode_s.size() / 2];
  std::printf(
      "{\"impl\": \"tdist\", \"tokens\": %zu, \"encode_tokens_per_s\": %.0f, "
      "\"encode_mb_per_s\": %.2f, \"decode_tokens_per_s\": %.0f, \"checksum\": \"%llu\"}\n",
      ids.size(), static_cast<double>(ids.size()) / e, static_cast<double>(text.size()) / e / 1e6,
      static_cast<double>(ids.size()) / d, static_cast<unsigned long long>(checksum));
  return 0;
}

// libFuzzer target for tokenizer.json as the trainer and from_pretrained read it
// (tdist::models::Tokenizer, src/models/tokenizer.cpp). Properties: any bytes either load or
// raise tdist::Error naming the file; a tokenizer that loads turns a Unicode stress text and
// the input's own bytes into ids inside its vocabulary (or refuses with tdist::Error), and
// decodes every id inside its vocabulary without crashing.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "tdist/error.h"
#include "tdist/models/tokenizer.h"

using tdist::models::Tokenizer;

namespace {

// from_file reads a path: each input goes through one file of this process.
const std::string& input_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/tdist_tokenizer_fuzz_" +
           std::to_string(::getpid()) + ".json";
  }();
  return path;
}

void write_input(const uint8_t* data, size_t size) {
  FILE* f = std::fopen(input_path().c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

void check_ids(const Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  for (const int64_t id : ids) {
    if (id < 0 || id >= tokenizer.vocab_size()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_input(data, size);
  std::optional<Tokenizer> tokenizer;
  try {
    tokenizer.emplace(Tokenizer::from_file(input_path()));
  } catch (const tdist::Error&) {
    return 0;
  }
  const std::string stress =
      "Hello, world! It's 2026; \xe6\x97\xa5\xe6\x9c\xac e\xcc\x81 <|endoftext|> 123\r\n  "
      "\xf0\x9f\x91\x8d";
  const std::string own(reinterpret_cast<const char*>(data), size < 256 ? size : 256);
  for (const std::string* text : {&stress, &own}) {
    for (const bool special : {true, false}) {
      try {
        const auto ids = tokenizer->encode(*text, special);
        check_ids(*tokenizer, ids);
        (void)tokenizer->decode(ids, /*skip_special_tokens=*/!special);
      } catch (const tdist::Error&) {
      }
    }
  }
  std::vector<int64_t> every;
  for (int64_t id = 0; id < tokenizer->vocab_size() && id < 4096; ++id) every.push_back(id);
  try {
    (void)tokenizer->decode(every);
  } catch (const tdist::Error&) {
  }
  return 0;
}

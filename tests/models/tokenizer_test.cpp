// Tokenizers against Python's `tokenizers` and `sentencepiece`: three byte-level BPE
// tokenizers trained on the bundled corpus in GPT-2's, Llama 3's and Qwen2's
// pre-tokenization and a SentencePiece BPE model with byte fallback, token for token on the
// corpus and a Unicode stress text; and what tokenizer.json may hold that tdist refuses.

#include <fstream>
#include <iterator>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "oracle.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/models/tokenizer.h"

using tdist::models::Tokenizer;
using tdist::testing::error_of;

namespace {

// The oracle's tokenizers and expectations, made once per test process.
const std::string& oracle_dir() {
  static const std::string dir = [] {
    const std::string d = tdist::testing::make_temp_dir("tok-oracle");
    tdist::testing::run_oracle_script(TOKENIZER_ORACLE_PY, {"make", d, CORPUS_TXT});
    return d;
  }();
  return dir;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

class TokenizerParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerParity, EncodeAndDecodeEqualTokenizers) {
  if (!tdist::testing::transformers_unavailable().empty()) {
    GTEST_SKIP() << tdist::testing::transformers_unavailable();
  }
  const std::string& dir = oracle_dir();
  const Tokenizer tok = Tokenizer::from_file(dir + "/" + GetParam() +
                                             (GetParam() == "sentencepiece" ? ".model" : ".json"));
  const auto expected = nlohmann::json::parse(read(dir + "/expected.json")).at(GetParam());
  ASSERT_GE(expected.size(), 9u);
  for (const auto& row : expected) {
    const std::string text = row.at("text").get<std::string>();
    const auto ids = row.at("ids").get<std::vector<int64_t>>();
    SCOPED_TRACE(text.substr(0, 60));
    EXPECT_EQ(tok.encode(text), ids);
    EXPECT_EQ(tok.encode(text, /*add_special_tokens=*/false),
              row.at("ids_plain").get<std::vector<int64_t>>());
    EXPECT_EQ(tok.decode(ids), row.at("decoded").get<std::string>());
    EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true),
              row.at("decoded_skip").get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, TokenizerParity,
                         ::testing::Values("gpt2", "llama3", "qwen2", "sentencepiece"));

TEST(Tokenizer, RefusesWhatItDoesNotImplementByName) {
  const std::string dir = tdist::testing::make_temp_dir("tok-bad");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  const std::string bpe = R"("model": {"type": "BPE", "vocab": {"a": 0}, "merges": []})";
  EXPECT_NE(
      error_of([&] {
        Tokenizer::from_file(write("n.json", R"({"normalizer": {"type": "NFKC"}, )" + bpe + "}"));
      }).find("normalizer 'NFKC' is not implemented"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] {
        Tokenizer::from_file(write("w.json", R"({"model": {"type": "WordPiece", "vocab": {}}})"));
      }).find("model type 'WordPiece' is not implemented"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              Tokenizer::from_file(
                  write("p.json", R"({"pre_tokenizer": {"type": "Whitespace"}, )" + bpe + "}"));
            }).find("pre_tokenizer 'Whitespace' is not implemented"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Tokenizer::from_file(write("j.json", "{oops"));
            }).find("is not a tokenizer.json"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Tokenizer::from_file(dir + "/missing.json"); }).find("cannot read"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Tokenizer::from_file(write("t.model", "not a model"));
            }).find("is not a SentencePiece model"),
            std::string::npos);
  const Tokenizer tok = Tokenizer::from_file(write("ok.json", "{" + bpe + "}"));
  EXPECT_EQ(tok.vocab_size(), 1);
  EXPECT_NE(error_of([&] { tok.decode({5}); }).find("id 5 is outside the vocabulary of 1"),
            std::string::npos);
}

// Found by fuzz/tokenizer_fuzzer.cpp: a float id became an undefined conversion, a negative
// one a write before the id table, a huge one a table of 2^60 entries.
TEST(Tokenizer, RefusesIdsThatAreNotTokenIds) {
  const std::string dir = tdist::testing::make_temp_dir("tok-ids");
  auto load = [&](const std::string& text) {
    std::ofstream(dir + "/t.json") << text;
    return error_of([&] { Tokenizer::from_file(dir + "/t.json"); });
  };
  for (const char* id : {"1e29", "-1", "1152921504606846976", "2.5", "\"3\""}) {
    SCOPED_TRACE(id);
    const std::string vocab_error = load(
        std::string(R"({"model": {"type": "BPE", "vocab": {"a": )") + id + R"(}, "merges": []}})");
    // The value is quoted as JSON writes it back (1e29 as 1e+29).
    EXPECT_NE(vocab_error.find("model.vocab[\"a\"] "), std::string::npos) << vocab_error;
    EXPECT_NE(vocab_error.find(" is not a token id"), std::string::npos) << vocab_error;
    const std::string added_error =
        load(std::string(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, )") +
             R"("added_tokens": [{"content": "<s>", "id": )" + id + "}]}");
    EXPECT_NE(added_error.find("added token id"), std::string::npos) << added_error;
  }
  const std::string outside =
      load(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "post_processor": )"
           R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, )"
           R"({"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": [7]}}}})");
  EXPECT_NE(outside.find("the post_processor adds id 7, outside the vocabulary of 1"),
            std::string::npos)
      << outside;
}

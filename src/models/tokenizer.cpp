// Byte-level BPE from Hugging Face's tokenizer.json (tdist/models/tokenizer.h).

#define PCRE2_CODE_UNIT_WIDTH 8
#include "tdist/models/tokenizer.h"

#include <pcre2.h>
#include <sentencepiece_processor.h>
#include <utf8proc.h>

#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "tdist/detail/util/text.h"
#include "tdist/error.h"

namespace tdist::models {
namespace {

using nlohmann::json;

// GPT-2's ByteLevel pre-tokenizer regex (use_regex: true).
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---- UTF-8 ---------------------------------------------------------------------------------

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n;
}

// Rust's String::from_utf8_lossy, which tokenizers' decode ends with: each invalid byte
// becomes U+FFFD.
std::string valid_utf8(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = utf8_length(bytes, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(bytes, i, n);
      i += n;
    }
  }
  return out;
}

// ---- GPT-2's bytes <-> unicode --------------------------------------------------------------

struct ByteMap {
  std::string byte_to_char[256];  // each byte's printable stand-in, as UTF-8
  std::unordered_map<std::string, unsigned char> char_to_byte;

  ByteMap() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256 + extra++;
      append_utf8(byte_to_char[b], cp);
      char_to_byte[byte_to_char[b]] = static_cast<unsigned char>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

// ---- regex ----------------------------------------------------------------------------------

struct Regex {
  pcre2_code* code = nullptr;

  Regex(const std::string& pattern, const std::string& where) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      TDIST_THROW(InvalidArgument, "tokenizer: " + where + ": the regex '" + pattern +
                                       "' does not compile (" +
                                       reinterpret_cast<const char*>(message) + " at " +
                                       std::to_string(offset) + ")");
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter is exact too
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Split "Isolated": every match is a piece, and so is the text between matches.
  void split_isolated(std::string_view text, std::vector<std::string_view>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
    size_t start = 0, last = 0;
    // PCRE2 checks the whole subject is UTF-8 on each call unless told not to: once is enough.
    uint32_t options = 0;
    while (start <= text.size()) {
      const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                                 start, options, md, nullptr);
      options = PCRE2_NO_UTF_CHECK;
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        TDIST_THROW(InvalidArgument, "tokenizer: the text is not valid UTF-8 (PCRE2 error " +
                                         std::to_string(rc) + ")");
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (b > last) out.push_back(text.substr(last, b - last));
      if (e > b) out.push_back(text.substr(b, e - b));
      last = e;
      if (e == b) {  // an empty match: step over one character
        if (b >= text.size()) break;
        const size_t n = utf8_length(text, b);
        start = b + (n == 0 ? 1 : n);
      } else {
        start = e;
      }
    }
    if (last < text.size()) out.push_back(text.substr(last));
    pcre2_match_data_free(md);
  }
};

// ---- the parts of tokenizer.json ------------------------------------------------------------

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

struct PreTokenizerStep {
  std::unique_ptr<Regex> split;  // Split(Isolated) or ByteLevel(use_regex)
  bool byte_level = false;
  bool add_prefix_space = false;
};

[[noreturn]] void refuse(const std::string& where, const std::string& what) {
  TDIST_THROW(InvalidArgument, "tokenizer: " + where + ": " + what +
                                   " is not implemented "
                                   "(tdist reads byte-level BPE tokenizers: GPT-2's, Llama 3's)");
}

// Real vocabularies stay under 2^18 ids; a bound keeps a hostile file from asking for a
// table of 2^63 entries.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

/// A token id as tokenizer.json spells it: a whole number from 0 to kMaxTokenId.
int64_t token_id(const json& value, const std::string& where, const std::string& field) {
  const bool in_range =
      (value.is_number_unsigned() && value.get<uint64_t>() <= uint64_t(kMaxTokenId)) ||
      (value.is_number_integer() && !value.is_number_unsigned() && value.get<int64_t>() >= 0 &&
       value.get<int64_t>() <= kMaxTokenId);
  if (!in_range) {
    TDIST_THROW(InvalidArgument, "tokenizer: " + where + ": " + field + " " + value.dump() +
                                     " is not a token id (a whole number from 0 to " +
                                     std::to_string(kMaxTokenId) + ")");
  }
  return value.get<int64_t>();
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

}  // namespace

struct Tokenizer::State {
  std::string where;
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> id_to_token;
  std::unordered_map<std::string, int> merge_rank;  // "a b" -> rank
  bool ignore_merges = false;
  std::optional<int64_t> unk_id;
  std::vector<AddedToken> added;
  std::vector<PreTokenizerStep> pre;
  std::vector<int64_t> prefix, suffix;  // TemplateProcessing's single sequence
  std::vector<bool> special;            // by id
  bool added_first_byte[256] = {};      // bytes an added token may start with
  bool nfc = false;                     // the NFC normalizer (Qwen2's)
  // A SentencePiece tokenizer.model (Llama 2, Mistral) is encoded by the library itself.
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sentencepiece;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache;

  void bpe(const std::string& word, std::vector<int64_t>& out) const;
  void encode_piece(std::string_view text, std::vector<int64_t>& out) const;
};

void Tokenizer::State::bpe(const std::string& word, std::vector<int64_t>& out) const {
  if (ignore_merges) {
    auto it = vocab.find(word);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache.find(word);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<std::string> symbols;
  for (size_t i = 0; i < word.size();) {
    size_t n = utf8_length(word, i);
    if (n == 0) n = 1;
    symbols.push_back(word.substr(i, n));
    i += n;
  }
  while (symbols.size() > 1) {
    int best = std::numeric_limits<int>::max();
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merge_rank.find(symbols[i] + " " + symbols[i + 1]);
      if (it != merge_rank.end() && it->second < best) best = it->second;
    }
    if (best == std::numeric_limits<int>::max()) break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (i + 1 < symbols.size()) {
        auto it = merge_rank.find(symbols[i] + " " + symbols[i + 1]);
        if (it != merge_rank.end() && it->second == best) {
          merged.push_back(symbols[i] + symbols[i + 1]);
          ++i;
          continue;
        }
      }
      merged.push_back(symbols[i]);
    }
    symbols.swap(merged);
  }
  std::vector<int64_t> ids;
  for (const auto& s : symbols) {
    auto it = vocab.find(s);
    if (it != vocab.end()) {
      ids.push_back(it->second);
    } else if (unk_id) {
      ids.push_back(*unk_id);
    }  // else dropped, as tokenizers does without an unk token
  }
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (cache.size() < 500000) cache.emplace(word, std::move(ids));
}

// Unicode NFC through utf8proc. ASCII is its own NFC; text that is not valid UTF-8 (which
// Python's tokenizers cannot be given) is left as it is.
std::string nfc_of(std::string_view text) {
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  utf8proc_uint8_t* composed = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &composed,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(text);
  std::string out(reinterpret_cast<const char*>(composed), static_cast<size_t>(n));
  std::free(composed);
  return out;
}

// A stretch of text between added tokens: normalized, pre-tokenized, mapped to bytes'
// stand-ins, BPE.
void Tokenizer::State::encode_piece(std::string_view text, std::vector<int64_t>& out) const {
  std::vector<std::string> pieces{nfc ? nfc_of(text) : std::string(text)};
  bool mapped = false;
  for (const auto& step : pre) {
    std::vector<std::string> next;
    for (auto& piece : pieces) {
      if (step.byte_level && step.add_prefix_space && !piece.empty() && piece[0] != ' ') {
        piece = " " + piece;
      }
      if (step.split) {
        std::vector<std::string_view> parts;
        step.split->split_isolated(piece, parts);
        for (auto p : parts) next.emplace_back(p);
      } else {
        next.push_back(std::move(piece));
      }
    }
    pieces.swap(next);
    mapped = mapped || step.byte_level;
  }
  const ByteMap& map = byte_map();
  for (const auto& piece : pieces) {
    if (piece.empty()) continue;
    std::string word;
    if (mapped) {
      for (unsigned char b : piece) word += map.byte_to_char[b];
    } else {
      word = piece;
    }
    bpe(word, out);
  }
}

Tokenizer::Tokenizer(std::unique_ptr<State> state) : state_(std::move(state)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

namespace {

void read_model(const json& model, Tokenizer::State& s) {
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") refuse(s.where, "model type '" + type + "'");
  if (model.value("byte_fallback", false)) refuse(s.where, "model.byte_fallback");
  if (model.contains("dropout") && !model["dropout"].is_null()) refuse(s.where, "model.dropout");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && model[key] != "") {
      refuse(s.where, std::string("model.") + key);
    }
  }
  s.ignore_merges = model.value("ignore_merges", false);
  for (const auto& [token, id] : model.at("vocab").items()) {
    s.vocab[token] = token_id(id, s.where, "model.vocab[\"" + token + "\"]");
  }
  int rank = 0;
  for (const auto& m : model.at("merges")) {
    std::string key;
    if (m.is_string()) {
      key = m.get<std::string>();
    } else {
      key = m.at(0).get<std::string>() + " " + m.at(1).get<std::string>();
    }
    s.merge_rank.emplace(key, rank++);
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = s.vocab.find(model["unk_token"].get<std::string>());
    if (it != s.vocab.end()) s.unk_id = it->second;
  }
}

// NFC (alone or in a Sequence) is what the byte-level models ship (Qwen2); others refused.
void read_normalizer(const json& normalizer, Tokenizer::State& s) {
  if (normalizer.is_null()) return;
  const std::string type = normalizer.value("type", std::string("?"));
  if (type == "Sequence") {
    for (const auto& n : normalizer.at("normalizers")) read_normalizer(n, s);
  } else if (type == "NFC") {
    s.nfc = true;
  } else {
    refuse(s.where, "normalizer '" + type + "'");
  }
}

void read_pre_tokenizer(const json& pre, Tokenizer::State& s) {
  if (pre.is_null()) return;
  const std::string type = pre.value("type", std::string());
  if (type == "Sequence") {
    for (const auto& p : pre.at("pretokenizers")) read_pre_tokenizer(p, s);
    return;
  }
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.byte_level = true;
    step.add_prefix_space = pre.value("add_prefix_space", false);
    if (pre.value("use_regex", true)) step.split = std::make_unique<Regex>(kGpt2Pattern, s.where);
  } else if (type == "Split") {
    const std::string behavior = pre.value("behavior", std::string());
    if (behavior != "Isolated") refuse(s.where, "Split behavior '" + behavior + "'");
    if (pre.value("invert", false)) refuse(s.where, "Split.invert");
    const json& pattern = pre.at("pattern");
    if (!pattern.contains("Regex")) refuse(s.where, "a Split pattern that is not a Regex");
    step.split = std::make_unique<Regex>(pattern["Regex"].get<std::string>(), s.where);
  } else {
    refuse(s.where, "pre_tokenizer '" + type + "'");
  }
  s.pre.push_back(std::move(step));
}

void read_post_processor(const json& post, Tokenizer::State& s) {
  if (post.is_null()) return;
  const std::string type = post.value("type", std::string());
  if (type == "Sequence") {
    for (const auto& p : post.at("processors")) read_post_processor(p, s);
  } else if (type == "TemplateProcessing") {
    bool before = true;
    for (const auto& item : post.at("single")) {
      if (item.contains("Sequence")) {
        before = false;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      const json& ids = post.at("special_tokens").at(name).at("ids");
      for (const auto& id : ids) {
        (before ? s.prefix : s.suffix)
            .push_back(token_id(id, s.where, "post_processor special token '" + name + "'"));
      }
    }
  } else if (type != "ByteLevel") {  // ByteLevel only trims offsets
    refuse(s.where, "post_processor '" + type + "'");
  }
}

// tokenizer.model: the SentencePiece library, with its BOS when special tokens are asked for
// (as Llama 2's and Mistral's tokenizer_config.json set add_bos_token).
std::unique_ptr<Tokenizer::State> read_sentencepiece(const std::string& path) {
  auto s = std::make_unique<Tokenizer::State>();
  s->where = "'" + path + "'";
  s->sentencepiece = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = s->sentencepiece->Load(path);
  if (!status.ok()) {
    TDIST_THROW(InvalidArgument, "tokenizer: " + s->where + " is not a SentencePiece model (" +
                                     status.ToString() + ")");
  }
  const int size = s->sentencepiece->GetPieceSize();
  s->id_to_token.resize(static_cast<size_t>(size));
  s->special.assign(static_cast<size_t>(size), false);
  for (int id = 0; id < size; ++id) {
    s->id_to_token[static_cast<size_t>(id)] = s->sentencepiece->IdToPiece(id);
    s->special[static_cast<size_t>(id)] =
        s->sentencepiece->IsControl(id) || s->sentencepiece->IsUnknown(id);
  }
  if (s->sentencepiece->bos_id() >= 0) s->prefix.push_back(s->sentencepiece->bos_id());
  return s;
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  if (util::ends_with(path, ".model")) return Tokenizer(read_sentencepiece(path));
  std::ifstream in(path);
  if (!in) TDIST_THROW(InvalidArgument, "tokenizer: cannot read '" + path + "'");
  auto s = std::make_unique<State>();
  s->where = "'" + path + "'";
  json j;
  try {
    j = json::parse(in);
    read_normalizer(j.value("normalizer", json()), *s);
    const json decoder = j.value("decoder", json());
    if (!decoder.is_null() && decoder.value("type", std::string()) != "ByteLevel") {
      refuse(s->where, "decoder '" + decoder.value("type", std::string()) + "'");
    }
    read_model(j.at("model"), *s);
    read_pre_tokenizer(j.value("pre_tokenizer", json()), *s);
    read_post_processor(j.value("post_processor", json()), *s);
    for (const auto& a : j.value("added_tokens", json::array())) {
      AddedToken t{a.at("content").get<std::string>(),
                   token_id(a.at("id"), s->where, "added token id"), a.value("special", false),
                   a.value("lstrip", false), a.value("rstrip", false)};
      if (a.value("single_word", false)) refuse(s->where, "added token single_word");
      s->added.push_back(std::move(t));
    }
  } catch (const json::exception& e) {
    TDIST_THROW(InvalidArgument,
                "tokenizer: " + s->where + " is not a tokenizer.json (" + e.what() + ")");
  }
  int64_t size = 0;
  for (const auto& [token, id] : s->vocab) size = std::max(size, id + 1);
  for (const auto& a : s->added) size = std::max(size, a.id + 1);
  for (const auto* ids : {&s->prefix, &s->suffix}) {
    for (const int64_t id : *ids) {
      if (id >= size) {
        TDIST_THROW(InvalidArgument, "tokenizer: " + s->where + ": the post_processor adds id " +
                                         std::to_string(id) + ", outside the vocabulary of " +
                                         std::to_string(size) + " tokens");
      }
    }
  }
  s->id_to_token.resize(static_cast<size_t>(size));
  s->special.assign(static_cast<size_t>(size), false);
  for (const auto& [token, id] : s->vocab) s->id_to_token[static_cast<size_t>(id)] = token;
  for (const auto& a : s->added) {
    if (!a.content.empty()) s->added_first_byte[static_cast<unsigned char>(a.content[0])] = true;
    s->id_to_token[static_cast<size_t>(a.id)] = a.content;
    s->special[static_cast<size_t>(a.id)] = a.special;
  }
  return Tokenizer(std::move(s));
}

std::vector<int64_t> Tokenizer::encode(const std::string& text, bool add_special_tokens) const {
  const State& s = *state_;
  std::vector<int64_t> out;
  if (add_special_tokens) out = s.prefix;
  if (s.sentencepiece) {
    std::vector<int> ids;
    const auto status = s.sentencepiece->Encode(text, &ids);
    TDIST_CHECK_ARG(status.ok(), "tokenizer: SentencePiece could not encode the text (" +
                                     status.ToString() + ")");
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }
  // Added tokens first, leftmost-longest; lstrip / rstrip take the spaces beside them.
  size_t start = 0, i = 0;
  while (i < text.size()) {
    if (!s.added_first_byte[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const AddedToken* found = nullptr;
    for (const auto& a : s.added) {
      if (!a.content.empty() && text.compare(i, a.content.size(), a.content) == 0 &&
          (found == nullptr || a.content.size() > found->content.size())) {
        found = &a;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    size_t piece_end = i, next = i + found->content.size();
    if (found->lstrip) {
      while (piece_end > start && is_space(text[piece_end - 1])) --piece_end;
    }
    if (found->rstrip) {
      while (next < text.size() && is_space(text[next])) ++next;
    }
    s.encode_piece(std::string_view(text).substr(start, piece_end - start), out);
    out.push_back(found->id);
    start = i = next;
  }
  s.encode_piece(std::string_view(text).substr(start), out);
  if (add_special_tokens) out.insert(out.end(), s.suffix.begin(), s.suffix.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const State& s = *state_;
  if (s.sentencepiece) {
    std::vector<int> kept;
    for (int64_t id : ids) {
      TDIST_CHECK_ARG(id >= 0 && id < vocab_size(), "tokenizer: id " + std::to_string(id) +
                                                        " is outside the vocabulary of " +
                                                        std::to_string(vocab_size()));
      if (!(skip_special_tokens && s.special[static_cast<size_t>(id)])) {
        kept.push_back(static_cast<int>(id));
      }
    }
    std::string text;
    const auto status = s.sentencepiece->Decode(kept, &text);
    TDIST_CHECK_ARG(status.ok(),
                    "tokenizer: SentencePiece could not decode (" + status.ToString() + ")");
    return text;
  }
  const ByteMap& map = byte_map();
  std::string bytes;
  for (int64_t id : ids) {
    TDIST_CHECK_ARG(id >= 0 && id < vocab_size(), "tokenizer: id " + std::to_string(id) +
                                                      " is outside the vocabulary of " +
                                                      std::to_string(vocab_size()));
    if (skip_special_tokens && s.special[static_cast<size_t>(id)]) continue;
    const std::string& token = s.id_to_token[static_cast<size_t>(id)];
    // ByteLevel: each character back to its byte; a token with a character outside the
    // mapping (an added token's text) is taken as it is.
    std::string token_bytes;
    bool all_mapped = true;
    for (size_t i = 0; i < token.size() && all_mapped;) {
      size_t n = utf8_length(token, i);
      if (n == 0) n = 1;
      auto it = map.char_to_byte.find(token.substr(i, n));
      if (it == map.char_to_byte.end()) {
        all_mapped = false;
      } else {
        token_bytes += static_cast<char>(it->second);
      }
      i += n;
    }
    bytes += all_mapped ? token_bytes : token;
  }
  return valid_utf8(bytes);
}

int64_t Tokenizer::vocab_size() const {
  return static_cast<int64_t>(state_->id_to_token.size());
}

std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const {
  if (state_->sentencepiece) {
    const int id = state_->sentencepiece->PieceToId(token);
    if (id == state_->sentencepiece->unk_id() && token != state_->sentencepiece->IdToPiece(id)) {
      return std::nullopt;
    }
    return id;
  }
  for (const auto& a : state_->added) {
    if (a.content == token) return a.id;
  }
  auto it = state_->vocab.find(token);
  if (it == state_->vocab.end()) return std::nullopt;
  return it->second;
}

}  // namespace tdist::models

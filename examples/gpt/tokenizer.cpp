#include "gpt/tokenizer.h"

#include "tdist/error.h"

namespace gpt {

std::vector<int64_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(static_cast<int64_t>(c));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int64_t id : ids) {
    TDIST_CHECK_ARG(id >= 0 && id < kVocabSize,
                    "ByteTokenizer::decode: token id " + std::to_string(id) +
                        " is outside [0, 256); was the model trained with another vocabulary?");
    text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  }
  return text;
}

}  // namespace gpt

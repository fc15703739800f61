#include "launch/failure_cause.h"

#include <cctype>

namespace tdist::launch::detail {
namespace {

constexpr const char* kLost = "lost the connection to ";
constexpr const char* kFirstFailure = "first failure in the group: ";

// The number that starts `text` at `pos`, if any.
std::optional<int> number_at(const std::string& text, size_t pos) {
  size_t end = pos;
  while (end < text.size() && end - pos < 9 && std::isdigit(static_cast<unsigned char>(text[end])))
    ++end;
  if (end == pos) return std::nullopt;
  return std::stoi(text.substr(pos, end - pos));
}

// The rank after "<prefix>rank " ending just before `before`, searching backwards.
std::optional<int> last_rank_before(const std::string& text, size_t before,
                                    const std::string& prefix) {
  const std::string key = prefix + "rank ";
  size_t at = text.rfind(key, before);
  if (at == std::string::npos) return std::nullopt;
  return number_at(text, at + key.size());
}

// The peer of the first "lost the connection to ..." in `text`.
std::optional<int> lost_peer_in(const std::string& text) {
  size_t at = text.find(kLost);
  if (at == std::string::npos) return std::nullopt;
  size_t after = at + std::char_traits<char>::length(kLost);
  if (text.compare(after, 5, "rank ") == 0) return number_at(text, after + 5);
  if (text.compare(after, 2, "it") == 0) return last_rank_before(text, at, "waiting for ");
  return std::nullopt;
}

}  // namespace

std::optional<int> lost_peer_named_in(const std::vector<std::string>& lines) {
  for (auto line = lines.rbegin(); line != lines.rend(); ++line) {
    size_t first = line->rfind(kFirstFailure);
    if (first != std::string::npos) {
      if (auto peer = lost_peer_in(line->substr(first))) return peer;
    }
    if (auto peer = lost_peer_in(*line)) return peer;
  }
  return std::nullopt;
}

}  // namespace tdist::launch::detail

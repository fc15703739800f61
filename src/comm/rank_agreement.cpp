#include "tdist/comm/rank_agreement.h"

#include <algorithm>

#include "comm/state.h"
#include "tdist/comm/object_collectives.h"

namespace tdist {
namespace {

std::string join_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  return text;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
    lines.push_back(text.substr(start, end - start));
  }
  return lines;
}

}  // namespace

std::optional<Disagreement> find_disagreement(const std::vector<std::string>& lines,
                                              const ProcessGroupPtr& group) {
  auto pg = detail::resolve_group(group, "find_disagreement");
  if (!pg->is_member() || pg->size() == 1) return std::nullopt;
  std::vector<Object> gathered;
  all_gather_object(gathered, Object(join_lines(lines)), pg);
  const std::string& reference = gathered[0].as_string();
  const auto differs = std::find_if(gathered.begin(), gathered.end(),
                                    [&](const Object& o) { return o.as_string() != reference; });
  if (differs == gathered.end()) return std::nullopt;
  const auto ref = split_lines(reference);
  const auto other = split_lines(differs->as_string());
  Disagreement d;
  d.rank = pg->global_rank(static_cast<int>(differs - gathered.begin()));
  d.reference_rank = pg->global_rank(0);
  while (d.line < ref.size() && d.line < other.size() && ref[d.line] == other[d.line]) ++d.line;
  if (d.line < other.size()) d.value = other[d.line];
  if (d.line < ref.size()) d.reference_value = ref[d.line];
  return d;
}

}  // namespace tdist

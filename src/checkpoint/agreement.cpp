#include "checkpoint/agreement.h"

#include <algorithm>
#include <utility>

#include "tdist/detail/util/text.h"
#include "tdist/error.h"

namespace tdist::checkpoint::detail {

std::vector<Report> exchange(Coordinator& coordinator, const Report& mine,
                             const std::string& operation) {
  nlohmann::json j = {{"ok", mine.ok}, {"error", mine.error}, {"payload", mine.payload}};
  std::vector<std::string> messages;
  try {
    messages = coordinator.all_gather(j.dump());
  } catch (const std::exception& e) {
    TDIST_THROW(CheckpointError, "checkpoint: " + operation + " failed on rank " +
                                     std::to_string(coordinator.rank()) +
                                     ": the ranks could not agree (" + e.what() +
                                     "); a rank probably crashed. A save that did not commit "
                                     "leaves the previous checkpoint untouched");
  }
  std::vector<Report> out;
  for (const auto& m : messages) {
    auto r = nlohmann::json::parse(m);
    out.push_back(
        Report{r.at("ok").get<bool>(), r.at("error").get<std::string>(), r.at("payload")});
  }
  return out;
}

std::string describe_failures(const std::vector<Report>& reports) {
  // Ranks failing with the same message (a path none of them can read, the same bad
  // argument) are named once with it, so the message stays readable at any world size.
  std::vector<int> failed;
  std::vector<std::pair<std::string, std::vector<int>>> ranks_by_error;
  for (size_t r = 0; r < reports.size(); ++r) {
    if (reports[r].ok) continue;
    failed.push_back(static_cast<int>(r));
    auto same = std::find_if(ranks_by_error.begin(), ranks_by_error.end(),
                             [&](const auto& e) { return e.first == reports[r].error; });
    if (same == ranks_by_error.end()) {
      ranks_by_error.push_back({reports[r].error, {static_cast<int>(r)}});
    } else {
      same->second.push_back(static_cast<int>(r));
    }
  }
  if (failed.empty()) return "";
  std::string out = "rank(s) " + util::join(failed) + " failed: ";
  if (ranks_by_error.size() == 1) return out + ranks_by_error.front().first;
  for (size_t i = 0; i < ranks_by_error.size(); ++i) {
    const auto& [error, ranks] = ranks_by_error[i];
    out += (i == 0 ? "" : "; ") + std::string(ranks.size() == 1 ? "rank " : "ranks ") +
           util::join(ranks) + ": " + error;
  }
  return out;
}

}  // namespace tdist::checkpoint::detail

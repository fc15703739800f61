#include "checkpoint/agreement.h"

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
  std::string ranks, details;
  for (size_t r = 0; r < reports.size(); ++r) {
    if (reports[r].ok) continue;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    details += (details.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " +
               reports[r].error;
  }
  if (ranks.empty()) return "";
  return "rank(s) " + ranks + " failed: " + details;
}

}  // namespace tdist::checkpoint::detail

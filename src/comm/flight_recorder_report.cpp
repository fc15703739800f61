// The flight recorder's cross-rank report. When a collective times out, every rank that
// sees the failure publishes its progress on the group under "flight_recorder/rank_<i>" in
// the group's store; a rank whose collective timed out waits briefly for the others' and
// compares them: a rank that has not issued the stuck collective (or did not report at all)
// is behind, and dumps its records (once per group). Other failures (a lost peer) only
// publish, so that the ranks that time out can include them.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/comm_environment.h"
#include "comm/flight_recorder_hooks.h"
#include "comm/live_backends.h"
#include "tdist/detail/util/best_effort.h"
#include "tdist/detail/util/text.h"
#include "tdist/error.h"

namespace tdist::detail {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr const char* kKeyPrefix = "flight_recorder/rank_";
constexpr int kRecentPublished = 8;

/// What the report needs of a group, copied: a work's completion callback must not hold the
/// ProcessGroup itself (dropping the last reference on the backend's own thread would make
/// the backend join that thread).
class GroupRef {
 public:
  explicit GroupRef(const ProcessGroup& pg)
      : name_(pg.name()),
        ranks_(pg.global_ranks()),
        rank_(pg.rank()),
        timeout_(pg.timeout()),
        store_(pg.store()) {}
  const std::string& name() const { return name_; }
  const std::vector<int>& global_ranks() const { return ranks_; }
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  int global_rank(int group_rank) const { return ranks_.at(group_rank); }
  bool is_member() const { return rank_ >= 0; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const StorePtr& store() const { return store_; }

 private:
  std::string name_;
  std::vector<int> ranks_;
  int rank_;
  std::chrono::milliseconds timeout_;
  StorePtr store_;
};

bool is_timeout(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
    return true;
  } catch (...) {
    return false;
  }
}

std::chrono::milliseconds report_wait(const GroupRef& pg) {
  return std::min(comm_environment().report_wait, pg.timeout());
}

/// One failure per group and store: the first thread that sees it publishes, reports and
/// dumps; later ones (the waiting caller, other in-flight works) reuse its report.
struct Incident {
  std::weak_ptr<Store> store;
  bool done = false;
  std::string report;
};

struct Incidents {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::string, Incident> by_group;
};

/// Leaked on purpose: a backend thread may complete a work during exit.
Incidents& incidents() {
  static Incidents* all = new Incidents();
  return *all;
}

std::string incident_key(const GroupRef& pg) {
  std::ostringstream key;
  key << pg.name() << "@" << static_cast<const void*>(pg.store().get());
  return key.str();
}

std::string quoted(const std::string& label) {
  return label.empty() ? "(no label)" : "'" + label + "'";
}

std::string describe(const json& r) {
  return "seq " + std::to_string(r.value("seq", 0ULL)) + " " + r.value("op", std::string()) + " " +
         quoted(r.value("label", std::string()));
}

/// This rank's progress on the group: last completed and last issued collective, and the
/// most recent few (point-to-point ops have no sequence number of their own; left out).
json progress_of(const GroupRef& pg, bool timed_out) {
  std::vector<CollectiveRecord> records;
  for (auto& r : flight_records_of(pg.name(), pg.global_ranks())) {
    if (r.peer == -1) records.push_back(std::move(r));
  }
  json p;
  p["rank"] = pg.global_rank(pg.rank());
  p["pid"] = static_cast<int64_t>(::getpid());
  p["timed_out"] = timed_out;
  p["last_completed"] = nullptr;
  p["last_issued"] = nullptr;
  p["recent"] = json::array();
  for (auto it = records.rbegin(); it != records.rend(); ++it) {
    if (it->state == CollectiveState::kCompleted) {
      p["last_completed"] = json::parse(flight_record_json(*it));
      break;
    }
  }
  if (!records.empty()) p["last_issued"] = json::parse(flight_record_json(records.back()));
  const size_t first = records.size() > kRecentPublished ? records.size() - kRecentPublished : 0;
  for (size_t i = first; i < records.size(); ++i) {
    p["recent"].push_back(json::parse(flight_record_json(records[i])));
  }
  return p;
}

/// Note [Best-effort store calls]: a store whose host stopped would hold the failure up.
constexpr auto kPublishBudget = std::chrono::seconds(1);

void publish(const GroupRef& pg, const json& progress) {
  // The call's error text, empty when it succeeded.
  const std::optional<std::string> outcome = best_effort<std::string>(
      [store = pg.store(), key = kKeyPrefix + std::to_string(pg.rank()), value = progress.dump()] {
        try {
          store->set(key, value);
          return std::string();
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
      },
      kPublishBudget);
  if (!outcome || !outcome->empty()) {
    std::cerr << "tdist flight recorder: rank " << pg.global_rank(pg.rank())
              << " could not publish its progress on group '" << pg.name() << "': "
              << (outcome ? *outcome
                          : "the store did not answer within " +
                                std::to_string(kPublishBudget.count()) + " s")
              << "\n";
  }
}

/// Every other rank's published progress, waiting at most `wait` for the missing ones.
std::map<int, json> gather_progress(const GroupRef& pg, std::chrono::milliseconds wait) {
  std::map<int, json> got;
  const auto deadline = Clock::now() + wait;
  while (true) {
    try {
      for (int i = 0; i < pg.size(); ++i) {
        if (i == pg.rank() || got.count(i)) continue;
        const std::string key = kKeyPrefix + std::to_string(i);
        if (!pg.store()->check({key})) continue;
        auto parsed = json::parse(pg.store()->get_string(key), nullptr, false);
        if (!parsed.is_discarded()) got[i] = std::move(parsed);
      }
    } catch (const std::exception& e) {
      std::cerr << "tdist flight recorder: reading the other ranks' progress failed: " << e.what()
                << "\n";
      break;
    }
    if (static_cast<int>(got.size()) == pg.size() - 1 || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return got;
}

std::optional<json> record_at(const json& progress, uint64_t seq) {
  for (const auto& r : progress.value("recent", json::array())) {
    if (r.value("seq", 0ULL) == seq) return r;
  }
  return std::nullopt;
}

/// Compares every rank's progress with the collective that timed out here.
std::string build_report(const GroupRef& pg, uint64_t failed_id, const json& mine,
                         const std::map<int, json>& others, std::chrono::milliseconds wait) {
  const int me = pg.global_rank(pg.rank());
  // The stuck collective: the one that timed out here, else the oldest unfinished one.
  std::optional<json> stuck;
  for (const auto& r : mine["recent"]) {
    if (r.value("id", 0ULL) == failed_id) stuck = r;
  }
  if (!stuck) {
    for (const auto& r : mine["recent"]) {
      if (r.value("state", std::string()) != "completed") {
        stuck = r;
        break;
      }
    }
  }
  std::ostringstream out;
  out << "flight recorder report (rank " << me << ", process group '" << pg.name() << "', ranks ["
      << util::join(pg.global_ranks()) << "]): ";
  if (!stuck) {
    out << "no unfinished collective recorded here (recording off or ring too small)\n";
    return out.str();
  }
  const uint64_t seq = stuck->value("seq", 0ULL);
  const std::string stuck_text = describe(*stuck);
  out << stuck_text << " timed out after " << pg.timeout().count() << " ms.\n";
  const std::string before_text = mine["last_completed"].is_null()
                                      ? std::string("nothing recorded")
                                      : describe(mine["last_completed"]);

  std::vector<std::string> summary, details;
  std::vector<int> waiting;
  std::map<std::string, std::vector<int>> labels_at_seq;
  for (int i = 0; i < pg.size(); ++i) {
    const int global = pg.global_rank(i);
    const json* p = nullptr;
    if (i == pg.rank()) {
      p = &mine;
    } else if (auto it = others.find(i); it != others.end()) {
      p = &it->second;
    }
    if (p == nullptr) {
      summary.push_back("rank " + std::to_string(global) + " is behind on process group '" +
                        pg.name() + "': it did not report within " + std::to_string(wait.count()) +
                        " ms (stopped, hung, dead, or busy outside collectives); rank " +
                        std::to_string(me) + " last completed " + before_text + ", so rank " +
                        std::to_string(global) + " is stuck before " + stuck_text);
      details.push_back("  rank " + std::to_string(global) + ": no report");
      continue;
    }
    const json& last_completed = (*p)["last_completed"];
    const json& last_issued = (*p)["last_issued"];
    const uint64_t issued_seq = last_issued.is_null() ? 0 : last_issued.value("seq", 0ULL);
    details.push_back(
        "  rank " + std::to_string(global) + ": last completed " +
        (last_completed.is_null() ? std::string("none") : describe(last_completed)) +
        "; last issued " +
        (last_issued.is_null()
             ? std::string("none")
             : describe(last_issued) + " (" + last_issued.value("state", std::string()) + ")"));
    if (issued_seq < seq) {
      summary.push_back(
          "rank " + std::to_string(global) + " is behind on process group '" + pg.name() +
          "': last completed " +
          (last_completed.is_null() ? std::string("none") : describe(last_completed)) +
          ", stuck before " + stuck_text);
      continue;
    }
    waiting.push_back(global);
    if (auto at = record_at(*p, seq)) {
      labels_at_seq[at->value("op", std::string()) + " " +
                    quoted(at->value("label", std::string()))]
          .push_back(global);
    }
  }
  if (labels_at_seq.size() > 1) {
    std::string s =
        "the ranks disagree on seq " + std::to_string(seq) + " (a skipped or extra collective):";
    for (const auto& [what, ranks] : labels_at_seq) {
      s += " rank(s) " + util::join(ranks) + " issued " + what + ";";
    }
    summary.push_back(s);
  }
  if (summary.empty()) {
    summary.push_back("every rank issued " + stuck_text +
                      "; none is behind on this group (a slow peer, a too-short timeout, or "
                      "a rank blocked in another group)");
  }
  for (const auto& s : summary) out << s << "\n";
  if (!waiting.empty()) {
    out << "rank(s) " << util::join(waiting) << " issued " << stuck_text << "\n";
  }
  for (const auto& d : details) out << d << "\n";
  return out.str();
}

std::string handle_failure(uint64_t id, const GroupRef& pg, const std::exception_ptr& error) {
  const bool timed_out = is_timeout(error);
  flight_record_finish(id, timed_out ? CollectiveState::kTimedOut : CollectiveState::kFailed,
                       message_of(error));
  if (id == 0 || !pg.is_member()) return "";  // recording is off
  // Note [Aborting on a lost peer]: the loss is the report, and the store may be its host.
  if (live_backends_aborted()) return "";
  const std::string key = incident_key(pg);
  const auto wait = report_wait(pg);
  auto& all = incidents();
  {
    std::unique_lock<std::mutex> lock(all.mutex);
    auto it = all.by_group.find(key);
    if (it != all.by_group.end() && it->second.store.lock() == pg.store()) {
      // Another thread is on it: wait for its report (bounded), never report twice.
      all.cv.wait_for(lock, wait + std::chrono::seconds(2), [&] { return it->second.done; });
      return it->second.report;
    }
    Incident incident;
    incident.store = pg.store();
    all.by_group[key] = incident;
  }
  std::string report;
  try {
    json mine = progress_of(pg, timed_out);
    publish(pg, mine);
    if (timed_out) {
      auto others = gather_progress(pg, wait);
      report = build_report(pg, id, mine, others, wait);
      flight_record_set_report(report);
      // The dump's path first, the explanation last: launchers show a failed rank's last lines.
      flight_recorder_dump_to_file();
      std::cerr << "tdist: " << report << std::flush;
    }
  } catch (const std::exception& e) {
    std::cerr << "tdist flight recorder: the report failed: " << e.what() << "\n";
  }
  {
    std::lock_guard<std::mutex> lock(all.mutex);
    auto& incident = all.by_group[key];
    incident.done = true;
    incident.report = report;
  }
  all.cv.notify_all();
  return report;
}

}  // namespace

void flight_record_track(uint64_t id, const ProcessGroupPtr& pg, const WorkPtr& work) {
  if (id == 0 || !work || !pg) return;
  auto group = std::make_shared<GroupRef>(*pg);
  work->then([id, group](Work& w) {
    auto error = w.exception();
    if (!error) {
      flight_record_finish(id, CollectiveState::kCompleted, "");
      return;
    }
    handle_failure(id, *group, error);
  });
}

std::string flight_record_failure(uint64_t id, const ProcessGroup& pg, std::exception_ptr error) {
  try {
    return handle_failure(id, GroupRef(pg), error);
  } catch (...) {
    return "";
  }
}

}  // namespace tdist::detail

// The flight recorder's ring of records, the label scope and the dumps. The cross-rank
// report on a timeout lives in flight_recorder_report.cpp.

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "comm/comm_environment.h"
#include "comm/flight_recorder_hooks.h"

namespace tdist {

namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// The process-wide ring of records.
class Recorder {
 public:
  static Recorder& get() {
    // Leaked on purpose: collectives may complete on backend threads during exit.
    static Recorder* recorder = new Recorder();
    return *recorder;
  }

  uint64_t add(CollectiveRecord record) {
    std::lock_guard<std::mutex> lock(mutex_);
    rank_ = record.rank;
    if (capacity_ == 0) return 0;
    record.id = ++next_id_;
    record.issued_us = now_us();
    records_.push_back(std::move(record));
    while (records_.size() > capacity_) records_.pop_front();
    return records_.back().id;
  }

  void finish(uint64_t id, CollectiveState state, const std::string& error) {
    if (id == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    // Recent records are at the back; ids increase along the ring.
    for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
      if (it->id < id) return;
      if (it->id != id) continue;
      if (it->state != CollectiveState::kIssued) return;  // the first outcome wins
      it->state = state;
      it->finished_us = now_us();
      it->error = error;
      return;
    }
  }

  std::vector<CollectiveRecord> records() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {records_.begin(), records_.end()};
  }

  std::vector<CollectiveRecord> records_of(const std::string& group,
                                           const std::vector<int>& ranks) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<CollectiveRecord> out;
    for (const auto& r : records_) {
      if (r.group == group && r.group_ranks == ranks) out.push_back(r);
    }
    return out;
  }

  size_t capacity() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return capacity_;
  }
  void set_capacity(size_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    capacity_ = capacity;
    while (records_.size() > capacity_) records_.pop_front();
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    records_.clear();
    report_.clear();
  }
  void set_report(const std::string& report) {
    std::lock_guard<std::mutex> lock(mutex_);
    report_ = report;
  }
  std::string report() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return report_;
  }
  int rank() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return rank_;
  }

 private:
  Recorder() : capacity_(detail::comm_environment().flight_recorder_size) {}

  mutable std::mutex mutex_;
  size_t capacity_;
  uint64_t next_id_ = 0;
  std::deque<CollectiveRecord> records_;
  std::string report_;
  int rank_ = -1;
};

thread_local std::string t_label;

nlohmann::json record_to_json(const CollectiveRecord& r) {
  nlohmann::json j;
  j["id"] = r.id;
  j["group"] = r.group;
  j["group_ranks"] = r.group_ranks;
  j["rank"] = r.rank;
  j["seq"] = r.seq;
  j["op"] = r.op;
  if (r.peer >= 0) j["peer"] = r.peer;
  if (r.peer == kAnyPeer) j["peer"] = "any";
  j["shapes"] = r.shapes;
  j["dtypes"] = r.dtypes;
  j["label"] = r.label;
  j["state"] = to_string(r.state);
  j["issued_us"] = r.issued_us;
  j["finished_us"] = r.finished_us;
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

int rank_for_file_name() {
  int rank = Recorder::get().rank();
  if (rank >= 0) return rank;
  const char* env = std::getenv("RANK");
  return env != nullptr && *env != '\0' ? std::atoi(env) : 0;
}

}  // namespace

const char* to_string(CollectiveState state) {
  switch (state) {
    case CollectiveState::kIssued:
      return "issued";
    case CollectiveState::kCompleted:
      return "completed";
    case CollectiveState::kFailed:
      return "failed";
    case CollectiveState::kTimedOut:
      return "timed out";
  }
  return "unknown";
}

CollectiveLabelScope::CollectiveLabelScope(std::string label) : previous_(std::move(t_label)) {
  t_label = std::move(label);
}

CollectiveLabelScope::~CollectiveLabelScope() {
  t_label = std::move(previous_);
}

const std::string& CollectiveLabelScope::current() {
  return t_label;
}

std::vector<CollectiveRecord> flight_recorder_records() {
  return Recorder::get().records();
}

std::string flight_recorder_dump() {
  nlohmann::json doc;
  doc["rank"] = rank_for_file_name();
  doc["pid"] = static_cast<int64_t>(::getpid());
  doc["capacity"] = Recorder::get().capacity();
  doc["dumped_us"] = now_us();
  doc["records"] = nlohmann::json::array();
  for (const auto& r : Recorder::get().records()) doc["records"].push_back(record_to_json(r));
  doc["report"] = Recorder::get().report();
  return doc.dump(1);
}

namespace {

/// Where a dump goes: TDIST_FLIGHT_RECORDER_DIR (tdistrun points it at its log directory), else
/// the temp directory with the pid in the name, since jobs there share one folder. Never
/// stderr: the dump is long JSON, and the last lines a rank prints should be its report.
std::filesystem::path dump_path() {
  const std::string rank = std::to_string(rank_for_file_name());
  const std::string dir = detail::comm_environment().flight_recorder_dir;
  if (!dir.empty())
    return std::filesystem::path(dir) / ("tdist_flight_recorder_rank" + rank + ".json");
  std::error_code ec;
  std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  return tmp / "tdist_flight_recorder" /
         ("rank" + rank + "_pid" + std::to_string(::getpid()) + ".json");
}

}  // namespace

std::string flight_recorder_dump_to_file() {
  const std::string dump = flight_recorder_dump();
  namespace fs = std::filesystem;
  const fs::path path = dump_path();
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  // Write then rename, so a reader never sees half a dump.
  const fs::path tmp = path.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << dump << "\n";
    if (!out) {
      std::cerr << "tdist flight recorder: cannot write " << tmp.string()
                << " (check TDIST_FLIGHT_RECORDER_DIR); dump follows:\n"
                << dump << std::endl;
      return "";
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    std::cerr << "tdist flight recorder: cannot rename " << tmp.string() << " to " << path.string()
              << ": " << ec.message() << "\n";
    return "";
  }
  std::cerr << "tdist flight recorder: rank " << rank_for_file_name() << " dumped "
            << Recorder::get().records().size() << " record(s) to " << path.string() << "\n";
  return path.string();
}

std::string flight_recorder_last_report() {
  return Recorder::get().report();
}

size_t flight_recorder_capacity() {
  return Recorder::get().capacity();
}

void flight_recorder_set_capacity(size_t capacity) {
  Recorder::get().set_capacity(capacity);
}

void flight_recorder_clear() {
  Recorder::get().clear();
}

namespace detail {

uint64_t flight_record_issue(const ProcessGroup& pg, uint64_t seq, const std::string& op,
                             const std::vector<at::Tensor>& tensors, int peer) {
  auto& recorder = Recorder::get();
  if (recorder.capacity() == 0) return 0;
  CollectiveRecord r;
  r.group = pg.name();
  r.group_ranks = pg.global_ranks();
  r.rank = pg.is_member() ? pg.global_rank(pg.rank()) : -1;
  r.seq = seq;
  r.op = op;
  r.peer = peer;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    r.shapes.emplace_back(t.sizes().begin(), t.sizes().end());
    r.dtypes.emplace_back(c10::toString(t.scalar_type()));
  }
  r.label = t_label;
  return recorder.add(std::move(r));
}

void flight_record_finish(uint64_t id, CollectiveState state, const std::string& error) {
  Recorder::get().finish(id, state, error);
}

std::vector<CollectiveRecord> flight_records_of(const std::string& group,
                                                const std::vector<int>& group_ranks) {
  return Recorder::get().records_of(group, group_ranks);
}

void flight_record_set_report(const std::string& report) {
  Recorder::get().set_report(report);
}

std::string flight_record_json(const CollectiveRecord& record) {
  return record_to_json(record).dump();
}

}  // namespace detail
}  // namespace tdist

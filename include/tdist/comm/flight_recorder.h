#pragma once

// The flight recorder: each process keeps its last N collectives (as PyTorch's
// TORCH_NCCL_TRACE_BUFFER_SIZE), so that a hang can be explained after the fact.
//
//  - TDIST_FLIGHT_RECORDER_SIZE=N keeps the last N records (default 256; 0 disables).
//  - TDIST_FLIGHT_RECORDER_DIR=dir: dumps go to dir/tdist_flight_recorder_rank<R>.json
//    (else to stderr).
//  - TDIST_FLIGHT_RECORDER_REPORT_WAIT_MS: how long a rank whose collective timed out waits
//    for the other ranks' state before writing its report (default 2000, at most the group's
//    timeout).
//
// Every collective issued through the tdist:: free functions is recorded with its group,
// sequence number, op, shapes, dtypes, state, timestamps and the label of the innermost
// CollectiveLabelScope of the issuing thread (FSDP sets the module name there). When a
// collective times out, each rank publishes its progress on that group in the group's
// store, waits briefly for the others, dumps its records and prints a report naming the
// rank that is behind and the label it is stuck before; the report is also appended to the
// TimeoutError raised by a synchronous collective. See docs/reliability.md.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tdist {

enum class CollectiveState { kIssued, kCompleted, kFailed, kTimedOut };

const char* to_string(CollectiveState state);

/// CollectiveRecord::peer of a receive from any source.
constexpr int kAnyPeer = -2;

/// One recorded collective (or point-to-point op).
struct CollectiveRecord {
  uint64_t id = 0;               ///< process-wide record number, from 1
  std::string group;             ///< process group name ("0" is the world)
  std::vector<int> group_ranks;  ///< global ranks of the group's members
  int rank = -1;                 ///< this process's global rank
  uint64_t seq = 0;              ///< the group's collective sequence number
  std::string op;                ///< "all_reduce", "send", ...
  int peer = -1;  ///< send/recv: the peer's global rank (kAnyPeer: from any); -1 otherwise
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> dtypes;
  std::string label;  ///< innermost CollectiveLabelScope at issue time ("" if none)
  CollectiveState state = CollectiveState::kIssued;
  int64_t issued_us = 0;    ///< wall clock, microseconds since the epoch
  int64_t finished_us = 0;  ///< 0 while in flight
  std::string error;        ///< the failure's message, when failed or timed out
};

/// Labels every collective issued on this thread while it lives (innermost scope wins):
///   tdist::CollectiveLabelScope scope("blocks.3 all_gather");
class CollectiveLabelScope {
 public:
  explicit CollectiveLabelScope(std::string label);
  ~CollectiveLabelScope();
  CollectiveLabelScope(const CollectiveLabelScope&) = delete;
  CollectiveLabelScope& operator=(const CollectiveLabelScope&) = delete;

  /// The label in effect on this thread ("" outside every scope).
  static const std::string& current();

 private:
  std::string previous_;
};

/// The records kept, oldest first.
std::vector<CollectiveRecord> flight_recorder_records();

/// The records (and the last report, if any) as a JSON document.
std::string flight_recorder_dump();

/// Writes flight_recorder_dump() atomically to
/// `$TDIST_FLIGHT_RECORDER_DIR/tdist_flight_recorder_rank<R>.json` or, when that is unset, to
/// `<temp dir>/tdist_flight_recorder/rank<R>_pid<P>.json`; prints and returns the path. Only
/// when the file cannot be written does the dump go to stderr (returns "").
std::string flight_recorder_dump_to_file();

/// The report written after the last timeout ("" if none happened).
std::string flight_recorder_last_report();

/// How many records are kept (0: recording is off).
size_t flight_recorder_capacity();

/// Changes the capacity (drops the oldest records beyond it; 0 turns recording off).
void flight_recorder_set_capacity(size_t capacity);

/// Forgets every record and report.
void flight_recorder_clear();

}  // namespace tdist

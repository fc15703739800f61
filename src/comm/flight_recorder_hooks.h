#pragma once

// Internal: how the collective front end (collectives.cpp) feeds the flight recorder
// (include/tdist/comm/flight_recorder.h), and what the recorder's two files share.

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/comm/flight_recorder.h"
#include "tdist/comm/process_group.h"
#include "tdist/comm/work.h"

namespace tdist::detail {

/// Records a collective issued on `pg` with sequence number `seq` (the group's counter after
/// the call was numbered); returns its id, 0 when recording is off.
uint64_t flight_record_issue(const ProcessGroup& pg, uint64_t seq, const std::string& op,
                             const std::vector<at::Tensor>& tensors, int peer = -1);

/// Marks record `id` when `work` completes; a timeout there runs the cross-rank report.
void flight_record_track(uint64_t id, const ProcessGroupPtr& pg, const WorkPtr& work);

/// A synchronous collective on `pg` raised `error`: marks record `id` and, for a timeout,
/// makes sure the report was written. Returns the report ("" when none). Never throws.
std::string flight_record_failure(uint64_t id, const ProcessGroup& pg, std::exception_ptr error);

// Shared by flight_recorder.cpp and flight_recorder_report.cpp.

/// Sets record `id`'s final state (no-op for 0 or a record already dropped or finished).
void flight_record_finish(uint64_t id, CollectiveState state, const std::string& error);

/// This process's records on group `group` (by name and members), oldest first.
std::vector<CollectiveRecord> flight_records_of(const std::string& group,
                                                const std::vector<int>& group_ranks);

/// Keeps `report` as the last report (flight_recorder_last_report and the dump).
void flight_record_set_report(const std::string& report);

/// The JSON of one record (also published in the store by the report).
std::string flight_record_json(const CollectiveRecord& record);

}  // namespace tdist::detail

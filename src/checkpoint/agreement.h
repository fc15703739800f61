#pragma once

// One round of Note [Checkpoint agreement]: every rank sends ok/error + a JSON payload and
// receives everybody's.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tdist/checkpoint/coordinator.h"

namespace tdist::checkpoint::detail {

struct Report {
  bool ok = true;
  std::string error;
  nlohmann::json payload = nlohmann::json::object();
};

/// Throws CheckpointError (on this rank) if the coordinator fails, e.g. a peer never arrives;
/// `operation` ("save of '/x'") prefixes the message.
std::vector<Report> exchange(Coordinator& coordinator, const Report& mine,
                             const std::string& operation);

/// "" when every report is ok; else "rank(s) 1, 3 failed: <error>" when they failed alike,
/// "rank(s) 1, 2, 3 failed: rank 1: <error>; ranks 2, 3: <other error>" when not.
std::string describe_failures(const std::vector<Report>& reports);

}  // namespace tdist::checkpoint::detail

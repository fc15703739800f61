#pragma once

// The collective save with a failure that happened before it on this rank (an asynchronous
// save whose staging failed): the plan round then reports it, so every rank fails together
// instead of waiting for this one.

#include <string>

#include "tdist/checkpoint/checkpoint.h"

namespace tdist::checkpoint::detail {

/// save(), except that a non-empty `local_failure` fails this rank's plan with that message.
void save_or_report_failure(const ShardedStateDict& state, const ExtraState& extra,
                            const std::string& dir, const SaveOptions& options,
                            const std::string& local_failure);

}  // namespace tdist::checkpoint::detail

#pragma once

// Internal helper shared by mesh and ddp: every rank contributes a string and receives all
// of them, so a cross-rank mismatch is detected identically on every rank (and raised by
// every rank) before the first collective whose shape depends on it.

#include <string>
#include <vector>

#include "tdist/comm/process_group.h"

namespace tdist::mesh::detail {

/// all_gather of variable-length strings over `group` (null: world), in group-rank order.
std::vector<std::string> all_gather_strings(const std::string& value,
                                            const ProcessGroupPtr& group = nullptr);

/// Index of the first group rank whose value differs from group rank 0's, or -1.
int first_mismatch(const std::vector<std::string>& values);

}  // namespace tdist::mesh::detail

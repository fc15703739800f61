#pragma once

// Checking that every rank of a group holds the same description of something (a model's
// parameters, a configuration) before the first collective that depends on it: ranks that
// disagree would otherwise issue collectives of different sizes, which Gloo reports late,
// as a mismatch of anonymous collectives, and NCCL not at all (a hang or corrupted data).

#include <optional>
#include <string>
#include <vector>

#include "tdist/comm/process_group.h"

namespace tdist {

/// The first line where a rank's description differs from the group's first rank's.
struct Disagreement {
  int rank = 0;            // global rank that differs (the lowest such)
  int reference_rank = 0;  // global rank of the group's first rank
  size_t line = 0;         // index of the first differing line
  // The two ranks' lines there; nullopt for a description that ends before it.
  std::optional<std::string> value;
  std::optional<std::string> reference_value;
};

/// Collective over `group` (null: the world): all-gathers every rank's `lines` and returns,
/// identically on every rank, the first difference from the group's first rank, or nullopt
/// when every rank gave the same lines. A group of one rank runs no collective.
std::optional<Disagreement> find_disagreement(const std::vector<std::string>& lines,
                                              const ProcessGroupPtr& group = nullptr);

}  // namespace tdist

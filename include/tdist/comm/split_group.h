#pragma once

// New groups made from an existing one, as torch.distributed.split_group and shrink_group.
// A backend that can derive the new group's communicator from the parent's (NCCL:
// ncclCommSplit, ncclCommShrink) does; every other backend (gloo, mpi, a registered one) is
// created afresh among the new group's ranks, as new_group creates it.

#include <any>
#include <chrono>
#include <string>
#include <vector>

#include "tdist/arg.h"
#include "tdist/comm/process_group.h"

namespace tdist {

struct SplitGroupOptions {
  /// Collective timeout of the new groups; zero: the parent's.
  TDIST_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
  /// Options of a backend that splits itself, in its own type (nccl::NCCLBackendOptions);
  /// empty: the parent's. Backends created afresh read theirs from the environment and
  /// refuse this (InvalidArgument).
  TDIST_ARG(std::any, pg_options);
  /// The new group's group_desc(); empty: "<parent's group_desc>:split:<n>", as c10d.
  TDIST_ARG(std::string, group_desc) = "";
};

/// As torch.distributed.split_group: `split_ranks` lists the new groups as ranks of
/// `parent_pg` (default: the world); each rank is in at most one list, and this rank gets
/// the group of the list it is in, or null when it is in none. Every rank of the parent
/// calls it, with the same lists, in the same order of calls; a rank outside the parent is
/// refused. Group ranks follow the sorted parent ranks of each list. Bad lists (empty, a
/// rank outside the parent, listed twice, in two lists) raise InvalidArgument on every rank
/// before anything is created.
ProcessGroupPtr split_group(const ProcessGroupPtr& parent_pg,
                            const std::vector<std::vector<int>>& split_ranks,
                            const SplitGroupOptions& options = {});

/// shrink_group's flags, as torch.distributed's SHRINK_DEFAULT and SHRINK_ABORT: with
/// kShrinkAbort, NCCL first aborts what is in flight on the parent communicator.
constexpr int kShrinkDefault = 0x00;
constexpr int kShrinkAbort = 0x01;

struct ShrinkGroupOptions {
  /// kShrinkDefault or kShrinkAbort.
  TDIST_ARG(int, shrink_flags) = kShrinkDefault;
  /// As SplitGroupOptions::pg_options.
  TDIST_ARG(std::any, pg_options);
};

/// As torch.distributed.shrink_group: a new group of `group`'s ranks (default: the world)
/// without `ranks_to_exclude` (ranks of `group`), in their order. Only the remaining ranks
/// call it; `group` is destroyed. Shrinking the world makes the new group the world: ranks
/// are renumbered 0..n-1 (get_rank() changes), and every other group is destroyed (their
/// ranks no longer mean the same processes). Refused with InvalidArgument: an empty list, a
/// rank outside the group, one listed twice, every rank, a group of one rank, unknown flags,
/// and a call from an excluded rank. The store stays where it was: excluding the process
/// that hosts a TCP store (the first world's rank 0 under env://) ends it when that process
/// exits.
ProcessGroupPtr shrink_group(const std::vector<int>& ranks_to_exclude,
                             const ProcessGroupPtr& group = nullptr,
                             const ShrinkGroupOptions& options = {});

}  // namespace tdist

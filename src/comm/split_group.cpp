// split_group and shrink_group: new groups from an existing one, by the backend's own split
// or shrink where it has one (NCCL), else by creating backends afresh among the new ranks.

#include "tdist/comm/split_group.h"

#include <algorithm>
#include <map>
#include <set>

#include "comm/state.h"
#include "tdist/comm/distributed.h"
#include "tdist/detail/util/text.h"
#include "tdist/error.h"
#include "tdist/store/prefix_store.h"

namespace tdist {

namespace {

/// Checked on every rank before anything is created, so a refused call leaves no group
/// behind and no peer waiting. Returns the index of the list holding `my_rank`, or -1.
int check_split_ranks(const std::vector<std::vector<int>>& split_ranks, int parent_size,
                      int my_rank) {
  const std::string where = "split_group: ";
  TDIST_CHECK_ARG(!split_ranks.empty(),
                  where +
                      "split_ranks is empty; give the new groups as lists of ranks of the "
                      "parent group");
  std::map<int, size_t> list_of;
  int mine = -1;
  for (size_t i = 0; i < split_ranks.size(); ++i) {
    const auto& ranks = split_ranks[i];
    TDIST_CHECK_ARG(!ranks.empty(), where + "split_ranks[" + std::to_string(i) + "] is empty");
    for (int r : ranks) {
      TDIST_CHECK_ARG(r >= 0 && r < parent_size,
                      where + "rank " + std::to_string(r) + " of split_ranks[" + std::to_string(i) +
                          "] is outside the parent group [0, " + std::to_string(parent_size) +
                          ") (split_ranks holds ranks of the parent group, not global ranks)");
      auto [it, fresh] = list_of.emplace(r, i);
      if (!fresh && it->second == i) {
        TDIST_THROW(InvalidArgument, where + "rank " + std::to_string(r) + " is listed twice in " +
                                         "split_ranks[" + std::to_string(i) + "] [" +
                                         util::join(ranks) + "]");
      }
      TDIST_CHECK_ARG(fresh, where + "rank " + std::to_string(r) + " is in split_ranks[" +
                                 std::to_string(it->second) + "] [" +
                                 util::join(split_ranks[it->second]) + "] and in split_ranks[" +
                                 std::to_string(i) + "] [" + util::join(ranks) +
                                 "]; each rank belongs to at most one new group");
      if (r == my_rank) mine = static_cast<int>(i);
    }
  }
  return mine;
}

/// pg_options go to backends that derive the new group from the parent; the others are
/// created from the environment and would silently ignore them.
void check_pg_options(const ProcessGroup& parent, const std::any& pg_options, bool splitting,
                      const std::string& op) {
  if (!pg_options.has_value()) return;
  for (const auto& [device, name] : parent.backend_names()) {
    const CollectiveBackend& backend = parent.backend(device);
    const bool derives = splitting ? backend.supports_splitting() : backend.supports_shrinking();
    TDIST_CHECK_ARG(derives, op + ": pg_options were given, but the group's " + device +
                                 " backend '" + name +
                                 "' is created afresh, from the "
                                 "environment (docs/configuration.md); give no pg_options");
  }
}

/// What the new group's backends start from: those the parent's backends made themselves
/// (by name), and the device -> name map every backend is set for.
struct DerivedBackends {
  std::map<std::string, std::string> spec;
  std::map<std::string, CollectiveBackendPtr> made;
};

template <typename Derive>
DerivedBackends derive_backends(const ProcessGroup& parent, bool splitting, Derive derive) {
  DerivedBackends out;
  out.spec = parent.backend_names();
  for (const auto& [device, name] : out.spec) {
    CollectiveBackend& backend = parent.backend(device);
    const bool derives = splitting ? backend.supports_splitting() : backend.supports_shrinking();
    if (derives && !out.made.count(name)) out.made[name] = derive(backend);
  }
  return out;
}

ProcessGroupPtr make_group(detail::WorldState& state, const std::string& name,
                           const std::string& desc, int my_rank, std::vector<int> global_ranks,
                           std::chrono::milliseconds timeout, DerivedBackends backends) {
  auto group_store =
      std::make_shared<PrefixStore>(detail::store_prefix(state) + "pg/" + name, state.store);
  auto pg =
      std::make_shared<ProcessGroup>(name, group_store, my_rank, std::move(global_ranks), timeout);
  pg->set_group_desc(desc);
  pg->set_debug_detail(state.debug_detail);
  detail::create_backends(*pg, backends.spec, group_store, timeout, state.device_id,
                          std::move(backends.made));
  return pg;
}

}  // namespace

ProcessGroupPtr split_group(const ProcessGroupPtr& parent_pg,
                            const std::vector<std::vector<int>>& split_ranks,
                            const SplitGroupOptions& options) {
  const ProcessGroupPtr parent = detail::resolve_group(parent_pg, "split_group");
  detail::WorldState& state = *detail::world_state();
  TDIST_CHECK_ARG(parent->is_member(),
                  "split_group: global rank " + std::to_string(state.world->rank()) +
                      " is not a member of the parent group '" + parent->name() +
                      "'; only the parent's ranks call split_group");
  TDIST_CHECK_ARG(!parent->is_destroyed(), "split_group: the parent group '" + parent->name() +
                                               "' was destroyed by destroy_process_group");
  TDIST_CHECK_ARG(options.timeout().count() >= 0, "split_group: timeout must not be negative");
  const int index = check_split_ranks(split_ranks, parent->size(), parent->rank());
  check_pg_options(*parent, options.pg_options(), /*splitting=*/true, "split_group");
  const auto timeout = options.timeout().count() > 0 ? options.timeout() : parent->timeout();
  const int split_id = parent->next_split_id();

  std::vector<int> mine;
  if (index >= 0) {
    mine = split_ranks[index];
    std::sort(mine.begin(), mine.end());
  }
  // ncclCommSplit is collective over the whole parent: ranks in no list take part too.
  DerivedBackends backends =
      derive_backends(*parent, /*splitting=*/true, [&](CollectiveBackend& backend) {
        return backend.split(mine, index, timeout, options.pg_options());
      });
  if (index < 0) return nullptr;

  const std::string name =
      parent->name() + ":split" + std::to_string(split_id) + ":" + std::to_string(index);
  const std::string desc = options.group_desc().empty()
                               ? parent->group_desc() + ":split:" + std::to_string(split_id)
                               : options.group_desc();
  std::vector<int> global_ranks;
  for (int r : mine) global_ranks.push_back(parent->global_rank(r));
  const int my_rank =
      static_cast<int>(std::find(mine.begin(), mine.end(), parent->rank()) - mine.begin());
  ProcessGroupPtr pg =
      make_group(state, name, desc, my_rank, global_ranks, timeout, std::move(backends));
  state.groups.push_back(pg);
  return pg;
}

ProcessGroupPtr shrink_group(const std::vector<int>& ranks_to_exclude, const ProcessGroupPtr& group,
                             const ShrinkGroupOptions& options) {
  const std::string where = "shrink_group: ";
  const int flags = options.shrink_flags();
  TDIST_CHECK_ARG(flags == kShrinkDefault || flags == kShrinkAbort,
                  where + "shrink_flags " + std::to_string(flags) +
                      " is neither kShrinkDefault (0) nor kShrinkAbort (1)");
  TDIST_CHECK_ARG(!ranks_to_exclude.empty(),
                  where +
                      "ranks_to_exclude is empty; name at least one rank to exclude (e.g. "
                      "the rank that failed)");
  const ProcessGroupPtr target = detail::resolve_group(group, "shrink_group");
  detail::WorldState& state = *detail::world_state();
  const bool is_world = target == state.world;
  TDIST_CHECK_ARG(target->is_member(), where + "global rank " +
                                           std::to_string(state.world->rank()) +
                                           " is not a member of group '" + target->name() + "'");
  TDIST_CHECK_ARG(!target->is_destroyed(),
                  where + "group '" + target->name() + "' was destroyed by destroy_process_group");
  const int size = target->size();
  TDIST_CHECK_ARG(size >= 2, where + "group '" + target->name() + "' has " + std::to_string(size) +
                                 " rank; a group must have at least 2 ranks to shrink");
  std::set<int> excluded;
  for (size_t i = 0; i < ranks_to_exclude.size(); ++i) {
    const int r = ranks_to_exclude[i];
    TDIST_CHECK_ARG(r >= 0 && r < size, where + "rank " + std::to_string(r) + " at index " +
                                            std::to_string(i) + " is outside group '" +
                                            target->name() + "' of size " + std::to_string(size) +
                                            " (valid ranks: 0 to " + std::to_string(size - 1) +
                                            ")");
    TDIST_CHECK_ARG(excluded.insert(r).second,
                    where + "rank " + std::to_string(r) + " is listed twice in ranks_to_exclude");
  }
  TDIST_CHECK_ARG(static_cast<int>(excluded.size()) < size,
                  where + "ranks_to_exclude names all " + std::to_string(size) +
                      " ranks of group '" + target->name() + "'; at least one must remain");
  TDIST_CHECK_ARG(!excluded.count(target->rank()),
                  where + "this rank (rank " + std::to_string(target->rank()) + " of group '" +
                      target->name() +
                      "') is in ranks_to_exclude; only the remaining ranks call shrink_group "
                      "(an excluded rank stops using the group, or ends its process)");
  check_pg_options(*target, options.pg_options(), /*splitting=*/false, "shrink_group");

  const std::vector<int> sorted_excluded(excluded.begin(), excluded.end());
  std::vector<int> remaining;  // global ranks, in group order
  int my_rank = -1;
  for (int r = 0; r < size; ++r) {
    if (excluded.count(r)) continue;
    if (r == target->rank()) my_rank = static_cast<int>(remaining.size());
    remaining.push_back(target->global_rank(r));
  }
  DerivedBackends backends =
      derive_backends(*target, /*splitting=*/false, [&](CollectiveBackend& backend) {
        return backend.shrink(sorted_excluded, flags, target->timeout(), options.pg_options());
      });

  // Shrinking the world renumbers it: global rank i is now the i-th remaining process, so
  // every other group's global ranks would name other processes (as c10d, they go).
  if (is_world) {
    for (int i = 0; i < static_cast<int>(remaining.size()); ++i) remaining[i] = i;
    for (auto& g : state.groups) g->release_backends();
    state.groups.clear();
    // Note [Heartbeats]: the monitor watches the old world's ranks; the excluded ones may
    // be gone, which would read as lost peers.
    state.heartbeat.reset();
  }
  const std::string name = target->name() + ":shrunk";
  const std::string desc = is_world ? "default:shrunken" : target->name() + ":shrunk";
  ProcessGroupPtr pg = make_group(state, name, desc, my_rank, std::move(remaining),
                                  target->timeout(), std::move(backends));
  target->release_backends();
  if (is_world) {
    state.world = pg;
  } else {
    auto& groups = state.groups;
    groups.erase(std::remove(groups.begin(), groups.end(), target), groups.end());
    groups.push_back(pg);
  }
  return pg;
}

}  // namespace tdist

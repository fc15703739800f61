// get_process_group_ranks, new_subgroups and new_subgroups_by_enumeration: torch.distributed's
// helpers over new_group.

#include <ATen/Context.h>

#include <map>
#include <string>

#include "comm/state.h"
#include "tdist/comm/distributed.h"
#include "tdist/detail/util/text.h"
#include "tdist/error.h"

namespace tdist {

namespace {

/// Checked before any group is made, so that a refused call leaves no subgroups behind.
void check_enumeration(const std::vector<std::vector<int>>& ranks_per_subgroup, int world_size) {
  const std::string where = "new_subgroups_by_enumeration: ";
  TDIST_CHECK_ARG(!ranks_per_subgroup.empty(), where + "the list of subgroups is empty");
  std::map<int, size_t> subgroup_of;
  for (size_t i = 0; i < ranks_per_subgroup.size(); ++i) {
    const auto& ranks = ranks_per_subgroup[i];
    TDIST_CHECK_ARG(!ranks.empty(), where + "subgroup #" + std::to_string(i) +
                                        " is empty; list its ranks (new_group's empty list "
                                        "means the whole world)");
    for (int r : ranks) {
      TDIST_CHECK_ARG(r >= 0 && r < world_size,
                      where + "rank " + std::to_string(r) + " of subgroup #" + std::to_string(i) +
                          " is outside the world [0, " + std::to_string(world_size) + ")");
      auto [it, fresh] = subgroup_of.emplace(r, i);
      TDIST_CHECK_ARG(fresh, where + "rank " + std::to_string(r) + " is in subgroup #" +
                                 std::to_string(it->second) + " [" +
                                 util::join(ranks_per_subgroup[it->second]) + "] and in #" +
                                 std::to_string(i) + " [" + util::join(ranks) + "]" +
                                 "; subgroups must not overlap");
    }
  }
}

}  // namespace

std::vector<int> get_process_group_ranks(const ProcessGroupPtr& group) {
  return detail::resolve_group(group, "get_process_group_ranks")->global_ranks();
}

Subgroups new_subgroups_by_enumeration(const std::vector<std::vector<int>>& ranks_per_subgroup,
                                       const NewGroupOptions& options) {
  auto world = detail::resolve_group(nullptr, "new_subgroups_by_enumeration");
  check_enumeration(ranks_per_subgroup, world->size());
  Subgroups out;
  for (const auto& ranks : ranks_per_subgroup) {
    out.all.push_back(new_group(ranks, options));
    if (out.all.back()->is_member()) out.current = out.all.back();
  }
  return out;
}

Subgroups new_subgroups(int group_size, const ProcessGroupPtr& group,
                        const NewGroupOptions& options) {
  const std::vector<int> ranks = detail::resolve_group(group, "new_subgroups")->global_ranks();
  const int size = static_cast<int>(ranks.size());
  if (group_size == 0) {
    group_size = static_cast<int>(at::getNumGPUs());
    TDIST_CHECK_ARG(group_size > 0,
                    "new_subgroups: no group_size given and no CUDA device to size subgroups by "
                    "(the default is one subgroup per machine of GPUs); pass group_size, the "
                    "number of ranks in each subgroup");
  }
  TDIST_CHECK_ARG(group_size > 0,
                  "new_subgroups: group_size " + std::to_string(group_size) + " must be positive");
  TDIST_CHECK_ARG(group_size <= size, "new_subgroups: group_size " + std::to_string(group_size) +
                                          " exceeds the group's size " + std::to_string(size));
  TDIST_CHECK_ARG(size % group_size == 0,
                  "new_subgroups: the group's size " + std::to_string(size) +
                      " is not divisible by group_size " + std::to_string(group_size) +
                      "; every subgroup has group_size ranks (for uneven ones use "
                      "new_subgroups_by_enumeration)");
  std::vector<std::vector<int>> ranks_per_subgroup;
  for (int first = 0; first < size; first += group_size) {
    ranks_per_subgroup.emplace_back(ranks.begin() + first, ranks.begin() + first + group_size);
  }
  return new_subgroups_by_enumeration(ranks_per_subgroup, options);
}

}  // namespace tdist

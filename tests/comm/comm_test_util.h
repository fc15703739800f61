#pragma once

// Helpers shared by the comm end-to-end tests.

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "comm/store_backend.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"

namespace tdist::testing {

/// Options for scenarios: the engine under test and a timeout short enough for tests.
inline InitProcessGroupOptions test_init_options() {
  return InitProcessGroupOptions().backend(test_backend()).timeout(std::chrono::seconds(30));
}

/// Every rank in `ranks` (all when empty) failed, and its output contains `fragment`.
inline void expect_failed_with(const std::vector<RankResult>& results, const std::string& fragment,
                               std::vector<int> ranks = {}) {
  if (ranks.empty()) {
    for (const auto& r : results) ranks.push_back(r.rank);
  }
  for (int rank : ranks) {
    const auto& r = results.at(rank);
    EXPECT_FALSE(r.timed_out) << "rank " << rank << " hung instead of failing:\n" << r.output;
    EXPECT_NE(r.exit_code, 0) << "rank " << rank << " succeeded but should have failed:\n"
                              << r.output;
    EXPECT_EQ(r.signal, 0) << "rank " << rank << " was killed (abort?) instead of raising:\n"
                           << r.output;
    EXPECT_NE(r.output.find(fragment), std::string::npos)
        << "rank " << rank << " output lacks '" << fragment << "':\n"
        << r.output;
  }
}

/// Runs `check` on the world (as a null group), then, in worlds of more than two ranks, on the
/// subgroup {1, 2} in its members: a subgroup whose ranks are not the world's, so group and
/// global ranks differ. Call between init_process_group and destroy_process_group.
inline void check_on_world_and_a_subgroup(
    const std::function<void(const ProcessGroupPtr&)>& check) {
  check(nullptr);
  if (get_world_size() <= 2) return;
  auto subgroup = new_group({1, 2});
  if (subgroup->is_member()) check(subgroup);
}

inline ProcessOptions short_run(std::chrono::seconds limit = std::chrono::seconds(60)) {
  ProcessOptions opts;
  opts.timeout = limit;
  return opts;
}

}  // namespace tdist::testing

// monitored_barrier over the group's store: every rank announces itself, rank 0 collects
// the announcements within the timeout and names the ranks that did not arrive; it then
// publishes the outcome so that every rank either passes or fails with the same message.

#include <thread>

#include "comm/state.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist {

namespace {

constexpr const char* kOk = "ok";

/// Polls until `ready()` or the deadline; returns whether it became ready.
template <typename Ready>
bool poll_until(std::chrono::steady_clock::time_point deadline, Ready ready) {
  auto sleep = std::chrono::milliseconds(1);
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace

void monitored_barrier(const ProcessGroupPtr& group, std::chrono::milliseconds timeout,
                       bool wait_all_ranks) {
  auto pg = detail::resolve_group(group, "monitored_barrier");
  if (!pg->is_member()) return;
  if (timeout.count() < 0) timeout = pg->timeout();
  Store& store = *pg->store();
  const std::string base = "monitored_barrier/" + std::to_string(pg->next_store_op_id()) + "/";
  const int me = pg->rank();
  const int my_global = pg->global_rank(me);
  const std::string result_key = base + "result";
  auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string ms = std::to_string(timeout.count()) + " ms";

  if (me != 0) {
    store.set(base + "arrived/" + std::to_string(me), std::string(kOk));
    // Rank 0 may itself wait the whole timeout for a missing peer; give it time to report.
    auto report_deadline = deadline + std::min(timeout, std::chrono::milliseconds(5000));
    if (!poll_until(report_deadline, [&] { return store.check({result_key}); })) {
      TDIST_THROW(TimeoutError, "rank " + std::to_string(my_global) +
                                    ": monitored_barrier on "
                                    "process group '" +
                                    pg->name() + "': group rank 0 (global rank " +
                                    std::to_string(pg->global_rank(0)) +
                                    ") did not respond within " + ms);
    }
    std::string result = store.get_string(result_key);
    if (result != kOk) {
      TDIST_THROW(TimeoutError, "rank " + std::to_string(my_global) + ": " + result);
    }
    return;
  }

  std::vector<int> missing;
  for (int r = 1; r < pg->size(); ++r) {
    const std::string key = base + "arrived/" + std::to_string(r);
    if (!poll_until(deadline, [&] { return store.check({key}); })) {
      missing.push_back(r);
      if (!wait_all_ranks) break;
    }
  }
  if (missing.empty()) {
    store.set(result_key, std::string(kOk));
    return;
  }
  std::string names;
  for (int r : missing) {
    names += (names.empty() ? "" : ", ") + std::to_string(pg->global_rank(r));
  }
  std::string msg = "monitored_barrier on process group '" + pg->name() + "' timed out after " +
                    ms + ": " + (missing.size() == 1 ? "rank " : "ranks ") + names +
                    (missing.size() == 1 ? " did" : " did") + " not arrive (global ranks" +
                    (wait_all_ranks ? ""
                                    : "; the first missing "
                                      "one shown, pass wait_all_ranks=true to list all") +
                    ")";
  store.set(result_key, msg);
  TDIST_THROW(TimeoutError, "rank " + std::to_string(my_global) + ": " + msg);
}

}  // namespace tdist

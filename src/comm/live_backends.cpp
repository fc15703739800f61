// The process's live backends: Note [Aborting on a lost peer] in live_backends.h.

#include "comm/live_backends.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace tdist::detail {
namespace {

struct LiveBackends {
  std::mutex mutex;
  std::vector<std::weak_ptr<CollectiveBackend>> backends;
  std::atomic<bool> aborted{false};
};

LiveBackends& live() {
  // Never destroyed: heartbeat threads may outlive main.
  static auto* instance = new LiveBackends();
  return *instance;
}

}  // namespace

void track_live_backend(const CollectiveBackendPtr& backend) {
  auto& l = live();
  std::lock_guard<std::mutex> lock(l.mutex);
  l.backends.erase(std::remove_if(l.backends.begin(), l.backends.end(),
                                  [](const auto& b) { return b.expired(); }),
                   l.backends.end());
  l.backends.push_back(backend);
}

bool abort_live_backends(const std::string& reason) {
  std::vector<CollectiveBackendPtr> alive;
  live().aborted = true;
  {
    auto& l = live();
    std::lock_guard<std::mutex> lock(l.mutex);
    for (const auto& weak : l.backends) {
      if (auto b = weak.lock()) alive.push_back(std::move(b));
    }
  }
  bool all_interrupted = true;
  for (const auto& backend : alive) all_interrupted = backend->abort(reason) && all_interrupted;
  return all_interrupted;
}

bool live_backends_aborted() {
  return live().aborted;
}

void forget_abort() {
  live().aborted = false;
}

}  // namespace tdist::detail

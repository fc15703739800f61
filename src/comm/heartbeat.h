#pragma once

// Internal: worker liveness inside a job, through the rendezvous store.
//
// Note [Heartbeats]
// A peer that vanishes without closing its sockets (a node's power or network lost, a
// process or node stopped) leaves every collective waiting for the group's timeout (30
// minutes by default). With heartbeats on (TDIST_HEARTBEAT_INTERVAL_MS > 0), each rank runs
// a thread that, every interval, over a store connection of its own:
//   1. adds 1 to heartbeat/beat/<rank>;
//   2. reads heartbeat/lost: once set, some rank declared a peer lost;
//   3. reads the beat counter of the next rank that has not finished (rank + 1, + 2, ...,
//      wrapping), and declares it lost when the counter has not moved for
//      TDIST_HEARTBEAT_MISSES intervals, by setting heartbeat/lost to a message naming the
//      rank, its host and process id, and how long it has been silent.
// Each rank is watched by one other, so the store sees O(world) requests per interval. Rank
// 0 hosts the store: when it stops answering, each rank's store requests time out after the
// same silence and each declares rank 0 lost itself. A store connection that is refused or
// reset instead means rank 0's process ended, which its collectives report; the thread then
// stops quietly. A rank that finishes (destroy_process_group, or process exit) marks
// heartbeat/done/<rank> first, so its silence afterwards is not a loss.
//
// On a loss every surviving rank prints the message and aborts its process groups (Note
// [Aborting on a lost peer] in live_backends.h): the collective it waits in, and every later
// one, raises DistBackendError naming the lost rank and its host. The program may catch it
// (to save what it can, or to go on without the group after destroy_process_group) or let it
// end the process; a launcher (tdistrun --max-restarts, torchrun, srun) restarts the job
// from its newest checkpoint either way. A rank still running the grace
// (TDIST_HEARTBEAT_GRACE_MS, by default the silence) after the abort without having called
// destroy_process_group is stuck where no abort reaches (a long computation, a store wait)
// or ignores the error: it ends with exit code kHeartbeatLostExitCode, as it does at once
// when one of its backends cannot interrupt a waiting operation. Nothing waits longer than
// the silence and the grace for a lost peer.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "tdist/store/store.h"

namespace tdist::detail {

constexpr int kHeartbeatLostExitCode = 75;

struct HeartbeatOptions {
  std::chrono::milliseconds interval{1000};
  int misses = 5;
  /// How long the process may go on after its groups were aborted; negative: silence().
  std::chrono::milliseconds grace{-1};
  /// How long a peer may be silent before it is lost.
  std::chrono::milliseconds silence() const { return interval * misses; }
  std::chrono::milliseconds effective_grace() const {
    return grace.count() >= 0 ? grace : silence();
  }
};

class HeartbeatMonitor {
 public:
  /// Called once, on the monitor's thread, with the message naming the lost peer. Returns
  /// whether the loss reaches the program as an error (every backend was aborted); false
  /// ends the process at once.
  using LostHandler = std::function<bool(const std::string& message)>;

  /// `store`: a connection of the monitor's own whose timeout is options.silence().
  /// `prefix`: this initialisation's key prefix.
  HeartbeatMonitor(StorePtr store, std::string prefix, int rank, int world_size,
                   HeartbeatOptions options, LostHandler on_lost);
  /// Marks this rank finished and stops the thread.
  ~HeartbeatMonitor();
  HeartbeatMonitor(const HeartbeatMonitor&) = delete;
  HeartbeatMonitor& operator=(const HeartbeatMonitor&) = delete;

  /// Prints the message on stderr and ends the process with kHeartbeatLostExitCode.
  static void end_process(const std::string& message);

 private:
  enum class Outcome { kGoOn, kStop, kLost };
  void run();
  /// on_lost_, then the grace: ends the process unless the monitor is stopped before.
  void handle_loss(const std::string& message);
  Outcome beat_and_watch();
  bool peer_finished(int peer);
  std::string describe(int peer, std::chrono::milliseconds silent);
  std::string key(const std::string& what) const;

  StorePtr store_;
  std::string prefix_;
  int rank_;
  int world_size_;
  HeartbeatOptions options_;
  LostHandler on_lost_;

  int watched_;  // the peer this rank watches; == rank_ when none is left
  int64_t last_count_ = -1;
  std::string lost_message_;  // set with Outcome::kLost
  std::chrono::steady_clock::time_point last_change_;

  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tdist::detail

#pragma once

// The one thread per process that calls MPI (see Note [MPI progress] in mpi_backend.h).

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tdist/comm/work.h"

namespace tdist::mpi::detail {

/// What starting an op produced: the requests to wait for, and what to do once they are
/// all complete (copy results back, divide for AVG, ...). All run on the executor thread.
struct StartedOp {
  std::vector<MPI_Request> requests;
  /// When set (sized as `requests`), receives the requests' statuses as they complete (a
  /// receive from MPI_ANY_SOURCE learns its sender there).
  std::shared_ptr<std::vector<MPI_Status>> statuses;
  std::function<void()> on_complete;
  /// A further stage, started (on the executor thread) after on_complete; the op's Work
  /// completes with its last stage (see Note [Direct collectives]).
  std::function<StartedOp()> next;
  /// An op that needs no MPI request (Note [Shared-memory collectives]): called on every
  /// poll, after the requests (if any) completed, until it returns true; it may do work in
  /// between and sets `progressed` when it did. It runs only once every op started before it
  /// in its lane has completed (Note [Executor lanes]). May throw (the op then fails).
  std::function<bool(bool& progressed)> poll;
};

/// The collectives of one communicator (Note [Executor lanes]).
struct Lane {
  /// Ops of this lane submitted and not yet finished (failed or abandoned ops included).
  std::atomic<int> in_flight{0};
  /// A caller thread is running an op of this lane itself (Note [Inline start] in
  /// mpi_backend.cpp): the executor runs no `poll` of the lane meanwhile.
  std::atomic<bool> inline_active{false};
};

class Executor {
 public:
  using Clock = std::chrono::steady_clock;

  /// The process-wide executor; initialises MPI on first use.
  static Executor& instance();

  /// Queues `start` (run in issue order on the executor thread) and returns its Work.
  /// `on_failure` runs (on the executor thread) if the op errors or passes `deadline`.
  /// `lane` (a communicator's; null for none) orders the `poll` of an op after every earlier
  /// op of the same lane (Note [Executor lanes]).
  WorkPtr submit(std::string description, std::vector<at::Tensor> outputs,
                 std::function<StartedOp()> start, Clock::time_point deadline,
                 std::function<void(const std::string&)> on_failure,
                 std::shared_ptr<Lane> lane = nullptr);

  /// Runs fn on the executor thread and waits for it; rethrows its exception.
  void run_sync(const std::function<void()>& fn);

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

 private:
  struct Task {
    std::string description;
    WorkPtr work;
    std::function<StartedOp()> start;
    Clock::time_point deadline;
    std::function<void(const std::string&)> on_failure;
    std::shared_ptr<Lane> lane;
  };
  struct Pending {
    Task task;
    StartedOp op;
  };

  Executor();
  void loop();
  void start_ready();  // starts the waiting ops whose lane is free (Note [One op per lane])
  void start_task(Task task);
  static void retire(const Task& task);  // the op left the executor: its lane's count drops
  void poll_pending();
  void shutdown();  // atexit: drain, MPI_Finalize, join

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::deque<Task> waiting_;  // executor thread only: submitted, not started
  std::list<Pending> pending_;
  // Ops that passed their deadline: kept so their buffers outlive MPI's use of them.
  std::list<Pending> abandoned_;
  std::vector<const Lane*> busy_lanes_;  // poll_pending() scratch
  bool stop_ = false;
  Clock::time_point stop_deadline_;
  Clock::time_point last_progress_;  // an op started, advanced a stage or completed
  int world_rank_ = -1;
  int world_size_ = -1;
  std::thread thread_;
};

/// Throws DistBackendError with MPI's own message when rc is not MPI_SUCCESS.
void check_mpi(int rc, const std::string& what);

}  // namespace tdist::mpi::detail

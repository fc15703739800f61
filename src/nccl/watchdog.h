#pragma once

// The NCCL backend's watchdog thread (c10d's ncclCommWatchdog): it completes each in-flight
// Work when its end event fires, and on the first collective past its deadline or NCCL
// asynchronous error it aborts the communicator (so no kernel waits forever for a dead
// peer), fails every in-flight Work with the reason and hands the reason to `on_fatal`.
// Completion callbacks (the flight recorder, DDP and FSDP hooks) run on this thread.
//
// It looks every `interval` (20 ms), which bounds how late a timeout is seen; while a Work
// whose wait() blocks the host is in flight (a barrier, any op under blocking wait) it looks
// every kHostWaitPoll instead, since the host waits on it and c10d's barrier returns as soon
// as the stream is done.

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nccl/communicator.h"
#include "nccl/nccl_work.h"

namespace tdist::nccl::detail {

class Watchdog {
 public:
  static constexpr std::chrono::microseconds kHostWaitPoll{100};

  /// `on_fatal(reason, timed_out)` runs once, on the watchdog thread, after the Works failed.
  Watchdog(Communicator& comm, std::string who, std::chrono::milliseconds interval,
           std::function<void(const std::string&, bool)> on_fatal);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void watch(std::shared_ptr<NCCLWork> work);
  /// Aborts the communicator and fails every in-flight Work with `reason` (a TimeoutError
  /// when `timed_out`), without on_fatal: for a failure the caller raises itself.
  void abort_in_flight(const std::string& reason, bool timed_out = false);
  /// Collectives issued and not yet seen complete.
  size_t in_flight() const;

 private:
  void run();
  bool stopping() const;
  /// At destruction: waits for the in-flight Works to complete, or one to pass its deadline.
  void drain();
  /// Completes the Works whose events fired; returns the first one past its deadline, if any.
  std::shared_ptr<NCCLWork> complete_finished();
  void fail_all(const std::string& reason, bool timed_out);
  /// How long to sleep before the next look (under the lock).
  std::chrono::microseconds next_poll_locked() const;

  Communicator& comm_;
  std::string who_;
  std::chrono::milliseconds interval_;
  std::function<void(const std::string&, bool)> on_fatal_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<NCCLWork>> in_flight_;
  bool stopping_ = false;
  bool failed_ = false;
  /// Set by watch() for a Work that blocks the host: wakes the thread to shorten its poll.
  bool host_waiter_added_ = false;
  std::thread thread_;
};

}  // namespace tdist::nccl::detail

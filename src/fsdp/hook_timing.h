#pragma once

// Where FSDP's hook time goes (FSDPStats, bench/fsdp).
//
// Note [Hook time accounting]
// Every hook entry point (pre/post forward, pre/post backward, the end-of-backward callback)
// runs under a HookTimer. Inside a hook, time is split into three disjoint parts:
//  - collective: issuing a collective and blocking on its Work (CommTimer);
//  - data movement (CopyTimer): allocating, filling, copying, casting and freeing the
//    buffers whose size is proportional to the parameter bytes: the all-gather input
//    (copy-in) and output, the unsharded parameter storage (copy-out), the post-forward
//    slab, the reduce-scatter input (copy-in, padding zeros) and output, the gradient
//    averaging (div_), the sharded-gradient install (clone, dtype/device cast, accumulation)
//    and the unsharded-gradient accumulation of no-sync backwards. PyTorch's FSDP2 counts
//    these as part of its collectives (foreach_all_gather copy-in / copy-out,
//    foreach_reduce);
//  - the framework's own bookkeeping: everything else (state checks and transitions, hook
//    dispatch, the autograd nodes FSDP inserts, pointing parameters at their data, prefetch
//    and rate-limit decisions, trace scopes, creating tensor views).
// The split uses per-thread running totals, so a collective or copy done for another group
// (a prefetch, the rate limit finishing an older all-gather) is never counted as the
// current hook's bookkeeping. Nested timers of one kind count once (the outermost).

#include <chrono>
#include <cstdint>

#include "tdist/fsdp/policies.h"

namespace tdist::fsdp::detail {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// This thread's running totals (only ever growing).
struct ThreadTimes {
  int64_t comm_ns = 0;
  int64_t copy_ns = 0;
  int comm_depth = 0;
  int copy_depth = 0;
};

inline ThreadTimes& thread_times() {
  thread_local ThreadTimes times;
  return times;
}

/// Time issuing or waiting for a collective, charged to `stats` (wait_ns or comm_issue_ns).
class CommTimer {
 public:
  explicit CommTimer(int64_t& counter) : counter_(counter), times_(thread_times()) {
    if (times_.comm_depth++ == 0) begin_ = now_ns();
  }
  ~CommTimer() {
    if (--times_.comm_depth != 0) return;
    const int64_t dt = now_ns() - begin_;
    counter_ += dt;
    times_.comm_ns += dt;
  }
  CommTimer(const CommTimer&) = delete;
  CommTimer& operator=(const CommTimer&) = delete;

 private:
  int64_t& counter_;
  ThreadTimes& times_;
  int64_t begin_ = 0;
};

/// Data movement, charged to stats.copy_ns (collective time inside it excluded).
class CopyTimer {
 public:
  explicit CopyTimer(FSDPStats& stats) : stats_(stats), times_(thread_times()) {
    if (times_.copy_depth++ == 0) {
      begin_ = now_ns();
      comm0_ = times_.comm_ns;
    }
  }
  ~CopyTimer() {
    if (--times_.copy_depth != 0) return;
    const int64_t dt = (now_ns() - begin_) - (times_.comm_ns - comm0_);
    stats_.copy_ns += dt;
    times_.copy_ns += dt;
  }
  CopyTimer(const CopyTimer&) = delete;
  CopyTimer& operator=(const CopyTimer&) = delete;

 private:
  FSDPStats& stats_;
  ThreadTimes& times_;
  int64_t begin_ = 0;
  int64_t comm0_ = 0;
};

/// A hook entry point: its wall time minus collectives and data movement (on this thread,
/// for any group) is the framework's bookkeeping, charged to stats.hook_cpu_ns.
class HookTimer {
 public:
  explicit HookTimer(FSDPStats& stats)
      : stats_(stats),
        times_(thread_times()),
        comm0_(times_.comm_ns),
        copy0_(times_.copy_ns),
        begin_(now_ns()) {}
  ~HookTimer() {
    const int64_t wall = now_ns() - begin_;
    stats_.hook_cpu_ns += wall - (times_.comm_ns - comm0_) - (times_.copy_ns - copy0_);
    ++stats_.hook_calls;
  }
  HookTimer(const HookTimer&) = delete;
  HookTimer& operator=(const HookTimer&) = delete;

 private:
  FSDPStats& stats_;
  ThreadTimes& times_;
  int64_t comm0_;
  int64_t copy0_;
  int64_t begin_;
};

}  // namespace tdist::fsdp::detail

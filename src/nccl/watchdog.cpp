#include "nccl/watchdog.h"

#include <c10/cuda/CUDAFunctions.h>

#include <iostream>

#include "nccl/nccl_types.h"
#include "tdist/error.h"

namespace tdist::nccl::detail {

Watchdog::Watchdog(Communicator& comm, std::string who, std::chrono::milliseconds interval,
                   std::function<void(const std::string&, bool)> on_fatal)
    : comm_(comm), who_(std::move(who)), interval_(interval), on_fatal_(std::move(on_fatal)) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::watch(std::shared_ptr<NCCLWork> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) {
      work->finish_with_error(std::make_exception_ptr(
          DistBackendError(who_ + ": the communicator was aborted by an earlier failure")));
      return;
    }
    if (work->blocks_host()) host_waiter_added_ = true;
    in_flight_.push_back(std::move(work));
  }
  cv_.notify_all();
}

bool Watchdog::stopping() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopping_;
}

size_t Watchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_flight_.size();
}

std::shared_ptr<NCCLWork> Watchdog::complete_finished() {
  std::vector<std::shared_ptr<NCCLWork>> done;
  std::shared_ptr<NCCLWork> late;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = NCCLWork::Clock::now();
    std::vector<std::shared_ptr<NCCLWork>> still;
    for (auto& w : in_flight_) {
      if (w->device_done()) {
        done.push_back(std::move(w));
      } else {
        if (!late && now >= w->deadline()) late = w;
        still.push_back(std::move(w));
      }
    }
    in_flight_ = std::move(still);
  }
  // Outside the lock: callbacks may issue further collectives. A callback that throws (a
  // DDP or FSDP hook) is reported; it does not stop the watchdog.
  for (auto& w : done) {
    try {
      w->finish();
    } catch (const std::exception& e) {
      std::cerr << "tdist: " << who_ << ": a completion callback of nccl " << w->op_name()
                << " failed: " << e.what() << "\n";
    }
  }
  return late;
}

void Watchdog::fail_all(const std::string& reason, bool timed_out) {
  abort_in_flight(reason, timed_out);
  if (!stopping()) on_fatal_(reason, timed_out);
}

void Watchdog::abort_in_flight(const std::string& reason, bool timed_out) {
  comm_.abort();  // kernels waiting on a dead or late peer return
  std::vector<std::shared_ptr<NCCLWork>> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
    failed.swap(in_flight_);
  }
  for (auto& w : failed) {
    const std::string text = who_ + ": nccl " + w->op_name() + " " + reason;
    w->finish_with_error(timed_out ? std::make_exception_ptr(TimeoutError(text))
                                   : std::make_exception_ptr(DistBackendError(text)));
  }
}

void Watchdog::drain() {
  // Collectives still queued when the group goes away (an all_reduce right before
  // destroy_process_group is stream-ordered, so usually still running) finish normally;
  // only one past its deadline makes the communicator abort.
  while (in_flight() > 0) {
    try {
      if (complete_finished()) {
        fail_all("was still unfinished past its deadline when its process group was destroyed",
                 true);
        return;
      }
    } catch (const std::exception& e) {
      // As in run(): a CUDA error while querying an event; nothing in flight can be trusted.
      fail_all(std::string("failed: CUDA reported an error: ") + e.what(), false);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::chrono::microseconds Watchdog::next_poll_locked() const {
  for (const auto& w : in_flight_) {
    if (w->blocks_host()) return kHostWaitPoll;
  }
  return interval_;
}

void Watchdog::run() {
  // Completion callbacks may allocate on "cuda": make it this rank's GPU on this thread too.
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(comm_.device()));
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, next_poll_locked(), [&] { return stopping_ || host_waiter_added_; });
      host_waiter_added_ = false;
      if (failed_ && !stopping_) continue;
    }
    if (stopping()) {
      drain();
      return;
    }
    std::shared_ptr<NCCLWork> late;
    try {
      late = complete_finished();
    } catch (const std::exception& e) {
      // A CUDA error while querying an event (a device fault): nothing in flight can be trusted.
      fail_all(std::string("failed: CUDA reported an error: ") + e.what(), false);
      continue;
    }
    if (const ncclResult_t e = comm_.async_error(); e != ncclSuccess) {
      fail_all("failed: NCCL reported an asynchronous error: " + nccl_error_text(e, comm_.get()) +
                   " (a peer died or the network failed; NCCL_DEBUG=INFO tells more)",
               false);
    } else if (late) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
          NCCLWork::Clock::now() - late->deadline());
      fail_all("timed out (past its deadline by " + std::to_string(waited.count()) +
                   " ms); the communicator was aborted: a peer is stopped, hung, dead, or issued "
                   "a different collective",
               true);
    }
  }
}

}  // namespace tdist::nccl::detail

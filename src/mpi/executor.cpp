#include "mpi/executor.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "tdist/error.h"

namespace tdist::mpi::detail {

void check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, message, &length);
  TDIST_THROW(DistBackendError, "mpi: " + what + " failed: " + std::string(message, length));
}

Executor& Executor::instance() {
  // Leaked on purpose: it must outlive every static that might still queue work; its
  // thread is stopped and MPI finalised by an atexit handler instead (see shutdown()).
  static Executor* executor = new Executor();
  return *executor;
}

Executor::Executor() {
  // Note [Executor start-up]: the start-up handshake lives on the heap, shared by both
  // threads, not in this constructor's frame: the thread reads the error slot after
  // notifying, when the constructor may already have returned. A read of a dead frame can
  // see a non-null garbage "error", and the thread would exit without running loop(),
  // leaving the first MPI op to hang.
  struct Startup {
    std::mutex mutex;
    std::condition_variable cv;
    bool ready = false;
    std::exception_ptr error;
  };
  auto startup = std::make_shared<Startup>();
  thread_ = std::thread([this, startup] {
    std::exception_ptr error;
    try {
      int initialized = 0;
      MPI_Initialized(&initialized);
      if (!initialized) {
        int provided = 0;
        check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided),
                  "MPI_Init_thread");
      }
      // Errors come back as return codes, so they become exceptions, not aborts.
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(startup->mutex);
      startup->error = error;
      startup->ready = true;
      startup->cv.notify_all();
    }
    if (!error) loop();
  });
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(startup->mutex);
    startup->cv.wait(lock, [&] { return startup->ready; });
    error = startup->error;
  }
  if (error) {
    thread_.join();
    std::rethrow_exception(error);
  }
  std::atexit([] { Executor::instance().shutdown(); });
}

WorkPtr Executor::submit(std::string description, std::vector<at::Tensor> outputs,
                         std::function<StartedOp()> start, Clock::time_point deadline,
                         std::function<void(const std::string&)> on_failure,
                         std::shared_ptr<Lane> lane) {
  auto work = std::make_shared<Work>(description, std::move(outputs));
  if (lane) ++lane->in_flight;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) {
      if (lane) --lane->in_flight;
      TDIST_THROW(DistBackendError, "mpi: " + description + " after MPI_Finalize");
    }
    queue_.push_back(Task{std::move(description), work, std::move(start), deadline,
                          std::move(on_failure), std::move(lane)});
  }
  cv_.notify_all();
  return work;
}

void Executor::run_sync(const std::function<void()>& fn) {
  if (std::this_thread::get_id() == thread_.get_id()) {
    fn();
    return;
  }
  auto work = submit(
      "setup", {},
      [&fn] {
        fn();
        return StartedOp{};
      },
      Clock::time_point::max(), nullptr);
  work->wait();
}

void Executor::retire(const Task& task) {
  if (task.lane) --task.lane->in_flight;
}

void Executor::start_task(Task task) {
  try {
    StartedOp op = task.start();
    pending_.push_back(Pending{std::move(task), std::move(op)});
  } catch (const std::exception& e) {
    retire(task);
    if (task.on_failure) task.on_failure(e.what());
    task.work->finish_with_error(std::current_exception());
  }
}

void Executor::start_ready() {
  // Note [One op per lane]: MPI lets nonblocking collectives of one communicator progress
  // together, but two ops on one tensor issued without a wait between them (a broadcast then
  // an all_reduce of its result) would then read and write it at once. So the ops of a lane
  // start one at a time, in issue order, as on a communicator running one op at a time
  // (PyTorch's MPI process group does the same); ops of other lanes, and send/recv (no
  // lane), still overlap.
  busy_lanes_.clear();
  for (const auto& p : pending_) {
    if (p.task.lane) busy_lanes_.push_back(p.task.lane.get());
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const Lane* lane = it->lane.get();
    if (lane && std::find(busy_lanes_.begin(), busy_lanes_.end(), lane) != busy_lanes_.end()) {
      ++it;
      continue;
    }
    Task task = std::move(*it);
    it = waiting_.erase(it);
    if (lane) busy_lanes_.push_back(lane);
    start_task(std::move(task));
  }
}

void Executor::poll_pending() {
  const auto now = Clock::now();
  // Note [Executor lanes]: ops are started in issue order, and MPI ops of one communicator
  // progress independently. An op with a `poll` (a shared-memory collective) reads and writes
  // its tensors itself as soon as it runs, so it runs only once every earlier op of its lane
  // (the collectives of its communicator; send/recv have no lane) has completed: the same
  // order, and the same data dependencies, as a communicator running one op at a time.
  // `busy_lanes` holds the lanes of ops still pending earlier in this pass.
  busy_lanes_.clear();
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto& p = *it;
    bool done = true;
    try {
      if (!p.op.requests.empty()) {
        int flag = 0;
        check_mpi(MPI_Testall(static_cast<int>(p.op.requests.size()), p.op.requests.data(), &flag,
                              p.op.statuses ? p.op.statuses->data() : MPI_STATUSES_IGNORE),
                  p.task.description);
        done = flag != 0;
      }
      if (done && p.op.poll) {
        const Lane* lane = p.task.lane.get();
        const bool blocked = lane != nullptr && (lane->inline_active.load() ||
                                                 std::find(busy_lanes_.begin(), busy_lanes_.end(),
                                                           lane) != busy_lanes_.end());
        bool progressed = false;
        done = !blocked && p.op.poll(progressed);
        if (progressed) last_progress_ = now;
      }
      if (done) {
        last_progress_ = now;
        if (p.op.on_complete) p.op.on_complete();
        if (p.op.next) {
          auto next = std::move(p.op.next);
          p.op = next();  // the next stage: keep polling the op
          if (p.task.lane) busy_lanes_.push_back(p.task.lane.get());
          ++it;
          continue;
        }
        // Retired before finishing, so a caller woken by finish() sees an idle lane.
        retire(p.task);
        p.task.work->finish();
      } else if (now > p.task.deadline) {
        const std::string reason = p.task.description +
                                   " did not complete before its timeout (a peer is slow, "
                                   "stopped or issued a different collective)";
        if (p.task.on_failure) p.task.on_failure(reason);
        p.task.work->finish_with_error(std::make_exception_ptr(TimeoutError("mpi: " + reason)));
        retire(p.task);
        abandoned_.splice(abandoned_.end(), pending_, it++);
        continue;
      }
    } catch (const std::exception& e) {
      retire(p.task);
      if (p.task.on_failure) p.task.on_failure(e.what());
      p.task.work->finish_with_error(std::current_exception());
      done = true;
    }
    if (!done && p.task.lane) busy_lanes_.push_back(p.task.lane.get());
    it = done ? pending_.erase(it) : std::next(it);
  }
}

void Executor::loop() {
  while (true) {
    std::deque<Task> tasks;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (pending_.empty() && waiting_.empty()) {
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      }
      // At exit, in-flight ops get a short grace period, not their full timeout.
      if (stop_ && queue_.empty() &&
          ((pending_.empty() && waiting_.empty()) || Clock::now() > stop_deadline_)) {
        break;
      }
      tasks.swap(queue_);
    }
    if (!tasks.empty()) last_progress_ = Clock::now();
    for (auto& task : tasks) waiting_.push_back(std::move(task));
    start_ready();
    poll_pending();
    if (!pending_.empty()) {
      // Note [Executor polling]: MPI moves large messages by rendezvous (request, copy,
      // acknowledgement), and each step waits for the peer's executor to poll. A timed sleep
      // per poll costs ~70 us (timer slack) per step, which dominated ops of up to a few
      // MiB. So while ops progress, poll back to back, yielding the core to anything else
      // runnable; only after kSpin without progress sleep between polls.
      constexpr auto kSpin = std::chrono::milliseconds(2);
      std::unique_lock<std::mutex> lock(mutex_);
      if (!queue_.empty()) continue;
      if (Clock::now() - last_progress_ < kSpin) {
        lock.unlock();
        std::this_thread::yield();
      } else {
        cv_.wait_for(lock, std::chrono::microseconds(50), [&] { return !queue_.empty(); });
      }
    }
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void Executor::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) return;
    stop_ = true;
    stop_deadline_ = Clock::now() + std::chrono::seconds(5);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tdist::mpi::detail

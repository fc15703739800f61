#include "tdist/comm/work.h"

#include "tdist/error.h"

namespace tdist {

Work::Work(std::string op_name, std::vector<at::Tensor> outputs)
    : op_name_(std::move(op_name)), outputs_(std::move(outputs)) {}

bool Work::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Done means completed with every callback run (see finish_with_error).
  auto done = [&] { return completed_ && callbacks_.empty(); };
  if (timeout.count() < 0) {
    cv_.wait(lock, done);
  } else if (!cv_.wait_for(lock, timeout, done)) {
    TDIST_THROW(TimeoutError, "Work::wait: '" + op_name_ + "' did not complete within " +
                                  std::to_string(timeout.count()) + " ms");
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && callbacks_.empty();
}

bool Work::is_success() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

int Work::source_rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return source_rank_;
}

void Work::set_source_rank(int group_rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  source_rank_ = group_rank;
}

void Work::then(std::function<void(Work&)> callback) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!completed_) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback(*this);
}

void Work::finish() {
  finish_with_error(nullptr);
}

void Work::finish_with_error(std::exception_ptr error) {
  // The callbacks (the flight recorder marking the collective completed, MPI copying results
  // out) run before waiters wake: whatever they do is visible once wait() returns. They stay
  // in callbacks_ meanwhile, which keeps wait() and is_completed() waiting; a then() arriving
  // now runs at once (completed_ is set).
  std::vector<std::function<void(Work&)>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return;  // idempotent: the first outcome wins
    completed_ = true;
    error_ = std::move(error);
    callbacks = callbacks_;
  }
  auto release_waiters = [&] {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      callbacks_.clear();
    }
    cv_.notify_all();
  };
  try {
    for (auto& callback : callbacks) callback(*this);
  } catch (...) {
    release_waiters();  // a throwing callback must not leave waiters blocked
    throw;
  }
  release_waiters();
}

WorkPtr completed_work(std::string op_name, std::vector<at::Tensor> outputs) {
  auto work = std::make_shared<Work>(std::move(op_name), std::move(outputs));
  work->finish();
  return work;
}

}  // namespace tdist

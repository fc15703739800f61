#include "tdist/comm/work.h"

#include "tdist/error.h"

namespace tdist {

Work::Work(std::string op_name, std::vector<at::Tensor> outputs)
    : op_name_(std::move(op_name)), outputs_(std::move(outputs)) {}

bool Work::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout.count() < 0) {
    cv_.wait(lock, [&] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    TDIST_THROW(TimeoutError, "Work::wait: '" + op_name_ + "' did not complete within " +
                                  std::to_string(timeout.count()) + " ms");
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool Work::is_success() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
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
  std::vector<std::function<void(Work&)>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return;  // idempotent: the first outcome wins
    completed_ = true;
    error_ = std::move(error);
    callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  for (auto& callback : callbacks) callback(*this);
}

WorkPtr completed_work(std::string op_name, std::vector<at::Tensor> outputs) {
  auto work = std::make_shared<Work>(std::move(op_name), std::move(outputs));
  work->finish();
  return work;
}

}  // namespace tdist

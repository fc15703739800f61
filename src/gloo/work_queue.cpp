#include "gloo/work_queue.h"

namespace tdist::detail {

GlooWorkQueue::GlooWorkQueue(std::function<void(std::exception_ptr)> on_error)
    : on_error_(std::move(on_error)), thread_([this] { loop(); }) {}

GlooWorkQueue::~GlooWorkQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GlooWorkQueue::push(WorkPtr work, std::function<void()> body) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back(std::move(work), std::move(body));
  }
  cv_.notify_all();
}

bool GlooWorkQueue::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return running_op_ || !queue_.empty();
}

void GlooWorkQueue::loop() {
  for (;;) {
    std::pair<WorkPtr, std::function<void()>> item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      item = std::move(queue_.front());
      queue_.pop_front();
      running_op_ = true;
    }
    std::exception_ptr error;
    try {
      item.second();
    } catch (...) {
      error = std::current_exception();
      if (on_error_) on_error_(error);
    }
    item.second = nullptr;  // release captured tensors before waking waiters
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_op_ = false;
    }
    item.first->finish_with_error(error);
  }
}

}  // namespace tdist::detail

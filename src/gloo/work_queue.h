#pragma once

// A worker thread that runs queued operations in issue order and completes their Work.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "tdist/comm/work.h"

namespace tdist::detail {

class GlooWorkQueue {
 public:
  /// `on_error` sees every exception an operation throws, before its Work is failed
  /// (used to mark the backend broken).
  explicit GlooWorkQueue(std::function<void(std::exception_ptr)> on_error);
  /// Runs what is queued, then joins the worker.
  ~GlooWorkQueue();
  GlooWorkQueue(const GlooWorkQueue&) = delete;
  GlooWorkQueue& operator=(const GlooWorkQueue&) = delete;

  void push(WorkPtr work, std::function<void()> body);
  /// True while an operation runs or waits in the queue.
  bool busy() const;

 private:
  void loop();

  std::function<void(std::exception_ptr)> on_error_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<WorkPtr, std::function<void()>>> queue_;
  bool running_op_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tdist::detail

#pragma once

// The handle of an asynchronous collective, as c10d's Work.

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tdist {

/// One in-flight collective. Backends complete it with finish() or finish_with_error();
/// callers wait() on it. wait() rethrows the collective's error on every call.
class Work {
 public:
  explicit Work(std::string op_name = "", std::vector<at::Tensor> outputs = {});
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  /// Blocks until completion; throws TimeoutError after `timeout` (negative: wait forever),
  /// or rethrows the collective's own error. Returns true on success.
  virtual bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  bool is_completed() const;
  bool is_success() const;
  std::exception_ptr exception() const;
  /// The tensors the collective wrote (empty for barrier).
  const std::vector<at::Tensor>& result() const { return outputs_; }
  const std::string& op_name() const { return op_name_; }
  /// The group rank a receive got its data from (c10d's Work::_source_rank): what a receive
  /// from any source (irecv with neither src nor group_src) learns when it completes; a
  /// receive from a named source knows it at once. -1 for every other op, and before a
  /// receive from any source has completed.
  int source_rank() const;

  /// Runs `callback` once the work completes (at once if it already has), on the completing
  /// thread. Used by DDP comm hooks and FSDP to chain work without blocking.
  void then(std::function<void(Work&)> callback);

  // Backend side.
  void finish();
  void finish_with_error(std::exception_ptr error);
  void set_source_rank(int group_rank);

 protected:
  std::string op_name_;
  std::vector<at::Tensor> outputs_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool completed_ = false;
  int source_rank_ = -1;
  std::exception_ptr error_;
  std::vector<std::function<void(Work&)>> callbacks_;
};

using WorkPtr = std::shared_ptr<Work>;

/// A Work that is already complete (used for synchronous paths and world size 1).
WorkPtr completed_work(std::string op_name, std::vector<at::Tensor> outputs = {});

}  // namespace tdist

// AsyncCheckpointer: stage on the caller's thread, plan -> write -> commit on a background
// thread (Note [Async save's agreement] in async_save.h).

#include "tdist/checkpoint/async_save.h"

#include <condition_variable>
#include <exception>
#include <iostream>
#include <mutex>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "checkpoint/save.h"
#include "checkpoint/streaming_copy.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::checkpoint {

namespace detail {

/// What a SaveFuture and its checkpointer share with the background thread.
struct AsyncSaveState {
  std::string path;
  std::mutex mutex;
  std::condition_variable finished_cv;
  bool finished = false;
  std::exception_ptr error;
  /// AsyncCheckpointer::wait() (or save()) has thrown `error` already.
  bool reported = false;
};

}  // namespace detail

namespace {

void wait_finished(detail::AsyncSaveState& state) {
  std::unique_lock<std::mutex> lock(state.mutex);
  state.finished_cv.wait(lock, [&] { return state.finished; });
}

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

/// The default group's own collectives are training's: a background save must not use them.
void check_not_training_group(const CoordinatorPtr& coordinator) {
  const auto* pg = dynamic_cast<const ProcessGroupCoordinator*>(coordinator.get());
  if (pg == nullptr || !tdist::is_initialized() || pg->group() != group_world()) return;
  TDIST_THROW(InvalidArgument,
              "async save: its coordinator agrees through the default process group, whose "
              "collectives training issues at the same time (their order would differ between "
              "ranks); leave SaveOptions::coordinator unset (a store-based coordinator), or "
              "give it a group of its own: ProcessGroupCoordinator(new_group(...))");
}

at::Tensor staging_buffer_like(const at::Tensor& src) {
  return at::empty(
      src.sizes(),
      at::TensorOptions().dtype(src.scalar_type()).device(at::kCPU).pinned_memory(src.is_cuda()));
}

}  // namespace

bool SaveFuture::done() const {
  TDIST_CHECK_ARG(valid(), "SaveFuture::done: this future refers to no save");
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->finished;
}

void SaveFuture::wait() const {
  TDIST_CHECK_ARG(valid(), "SaveFuture::wait: this future refers to no save");
  wait_finished(*state_);
  if (state_->error) std::rethrow_exception(state_->error);
}

const std::string& SaveFuture::path() const {
  TDIST_CHECK_ARG(valid(), "SaveFuture::path: this future refers to no save");
  return state_->path;
}

AsyncCheckpointer::AsyncCheckpointer(CoordinatorPtr coordinator)
    : coordinator_(std::move(coordinator)) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  join_writer();
  if (in_flight_ && in_flight_->error && !in_flight_->reported) {
    std::cerr << "tdist checkpoint: error: the asynchronous save of '" << in_flight_->path
              << "' failed and nobody waited for it: " << message_of(in_flight_->error) << "\n";
  }
}

void AsyncCheckpointer::join_writer() {
  if (writer_.joinable()) writer_.join();
}

void AsyncCheckpointer::wait() {
  join_writer();
  if (!in_flight_ || !in_flight_->error || in_flight_->reported) return;
  in_flight_->reported = true;
  std::rethrow_exception(in_flight_->error);
}

int64_t AsyncCheckpointer::staged_bytes() const {
  int64_t total = 0;
  for (const auto& [name, buffer] : staging_) total += buffer.nbytes();
  return total;
}

ShardedStateDict AsyncCheckpointer::stage(const ShardedStateDict& state) {
  at::NoGradGuard no_grad;
  ShardedStateDict staged;
  std::map<std::string, at::Tensor> buffers;
  for (const auto& [name, st] : state) {
    if (!st.local.defined()) {  // save() names it on every rank
      staged[name] = st;
      continue;
    }
    const at::Tensor src = st.local.detach();
    auto it = staging_.find(name);
    at::Tensor buffer = it != staging_.end() ? it->second : at::Tensor();
    if (!buffer.defined() || buffer.sizes() != src.sizes() ||
        buffer.scalar_type() != src.scalar_type() || (src.is_cuda() && !buffer.is_pinned())) {
      buffer = staging_buffer_like(src);
    }
    detail::streaming_copy_(buffer, src);  // Note [Streaming staging copies]
    buffers[name] = buffer;
    staged[name] = ShardedTensor{buffer, st.global_shape, st.offsets};
  }
  staging_ = std::move(buffers);  // tensors no longer saved give their memory back
  return staged;
}

SaveFuture AsyncCheckpointer::save(const ShardedStateDict& state, const ExtraState& extra,
                                   const std::string& dir, const SaveOptions& options,
                                   std::function<void()> after_commit) {
  try {
    wait();
  } catch (const std::exception& e) {
    TDIST_THROW(CheckpointError,
                "async save of '" + dir +
                    "' not started: the previous asynchronous save failed: " + e.what());
  }
  SaveOptions resolved = options;
  if (!resolved.coordinator()) {
    if (!coordinator_) coordinator_ = default_background_coordinator();
    resolved.coordinator(coordinator_);
  }
  check_not_training_group(resolved.coordinator());

  // A rank whose staging fails still joins the save, which then fails on every rank.
  ShardedStateDict staged;
  std::string staging_failure;
  try {
    staged = stage(state);
  } catch (const std::exception& e) {
    staging_failure = std::string("staging into host memory failed: ") + e.what();
  }

  auto shared = std::make_shared<detail::AsyncSaveState>();
  shared->path = dir;
  in_flight_ = shared;
  writer_ = std::thread([shared, staged = std::move(staged), extra, dir, resolved, staging_failure,
                         after_commit = std::move(after_commit)] {
    try {
      detail::save_or_report_failure(staged, extra, dir, resolved, staging_failure);
      if (after_commit) after_commit();
    } catch (...) {
      shared->error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      shared->finished = true;
    }
    shared->finished_cv.notify_all();
  });
  return SaveFuture(shared);
}

SaveFuture async_save(const ShardedStateDict& state, const ExtraState& extra,
                      const std::string& dir, const SaveOptions& options) {
  static AsyncCheckpointer checkpointer;
  return checkpointer.save(state, extra, dir, options);
}

}  // namespace tdist::checkpoint

#include "tdist/fsdp/trace.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

#include "fsdp/trace_scope.h"
#include "tdist/comm/distributed.h"

namespace tdist::fsdp {

namespace {
std::mutex g_mutex;
std::shared_ptr<SpanCallback> g_callback;  // guarded by g_mutex; copied out to call
std::atomic<bool> g_installed{false};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void set_span_callback(SpanCallback callback) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_callback = callback ? std::make_shared<SpanCallback>(std::move(callback)) : nullptr;
  g_installed = static_cast<bool>(g_callback);
}

bool span_callback_installed() {
  return g_installed.load(std::memory_order_relaxed);
}

namespace detail {

TraceScope::TraceScope(const char* phase, const std::string& label) {
  // Building an at::RecordFunction costs ~1 us even with no profiler; RECORD_FUNCTION's own
  // fast path asks for the active callbacks first.
  auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE);
  const bool profiling = callbacks.has_value();
  if (!profiling && !span_callback_installed()) return;
  name_ = std::string(phase) + " " + label;
  if (profiling) {
    record_.emplace(std::move(*callbacks));
    if (record_->isActive()) record_->before(name_);
  }
  if (span_callback_installed()) begin_ns_ = now_ns();
}

TraceScope::~TraceScope() {
  if (begin_ns_ == 0) return;
  std::shared_ptr<SpanCallback> callback;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    callback = g_callback;
  }
  if (!callback) return;
  Span span{name_, begin_ns_, now_ns(), is_initialized() ? get_rank() : -1};
  try {
    (*callback)(span);
  } catch (...) {
    // A tracing callback must never break training.
  }
}

}  // namespace detail
}  // namespace tdist::fsdp

#pragma once

// RAII phase label: a RECORD_FUNCTION scope plus a Span for the installed callback.

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/record_function.h>

namespace tdist::fsdp::detail {

class TraceScope {
 public:
  /// `phase` is a literal like "FSDP::all_gather"; `label` the module's name. When neither
  /// the profiler nor a span callback is active it costs a thread-local lookup and an atomic
  /// load: the RecordFunction is only built when a callback wants it (as RECORD_FUNCTION).
  TraceScope(const char* phase, const std::string& label);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  std::optional<at::RecordFunction> record_;
  std::string name_;
  int64_t begin_ns_ = 0;
};

}  // namespace tdist::fsdp::detail

#pragma once

// RAII phase label: a RECORD_FUNCTION scope plus a Span for the installed callback.

#include <cstdint>
#include <string>

#include <ATen/record_function.h>

namespace tdist::fsdp::detail {

class TraceScope {
 public:
  /// `phase` is a literal like "FSDP::all_gather"; `label` the module's name. Costs one
  /// atomic load when neither the profiler nor a span callback is active.
  TraceScope(const char* phase, const std::string& label);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  at::RecordFunction record_;
  std::string name_;
  int64_t begin_ns_ = 0;
};

}  // namespace tdist::fsdp::detail

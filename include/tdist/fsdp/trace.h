#pragma once

// Phase labels for profilers and the trace writer. Every FSDP phase ("FSDP::all_gather
// layers.0", "FSDP::reduce_scatter layers.0", "FSDP::pre_forward layers.0", ...) is recorded
// as a LibTorch RECORD_FUNCTION scope (visible to torch::autograd::profiler) and, when a span
// callback is installed, reported as a Span when it ends. One callback per process; the
// callback runs on the thread that ran the phase and must be cheap and thread-safe.

#include <cstdint>
#include <functional>
#include <string>

namespace tdist::fsdp {

struct Span {
  std::string name;      // e.g. "FSDP::all_gather layers.3"
  int64_t begin_ns = 0;  // steady_clock, nanoseconds
  int64_t end_ns = 0;
  int rank = -1;  // global rank, -1 before init_process_group
};

using SpanCallback = std::function<void(const Span&)>;

/// Installs (or, with nullptr, removes) the span callback.
void set_span_callback(SpanCallback callback);
/// True when a callback is installed (lets callers skip building names).
bool span_callback_installed();

}  // namespace tdist::fsdp

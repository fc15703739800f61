#pragma once

// A Chrome / Perfetto trace (the JSON "traceEvents" format): complete events ("ph":"X")
// with microsecond timestamps. Open trace_rank<r>.json in ui.perfetto.dev or
// chrome://tracing; load every rank's file together to see them side by side.

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace gpt {

class Tracer {
 public:
  /// pid shows as the process row (we use the rank); disabled tracers record nothing.
  explicit Tracer(int rank, bool enabled = true);

  /// Microseconds since this tracer was created.
  int64_t now_us() const;
  /// The creation time as steady_clock nanoseconds since its epoch (to convert spans that
  /// other code timed with steady_clock).
  int64_t origin_ns() const;
  /// Records a span [begin_us, end_us) on thread row `tid`; thread-safe.
  void add_span(const std::string& name, const std::string& category, int64_t begin_us,
                int64_t end_us, int tid = 0);
  /// Writes {"traceEvents": [...]} to path; throws tdist::Error when the file cannot be written.
  void write(const std::string& path) const;
  size_t size() const;
  bool enabled() const { return enabled_; }

 private:
  struct Event {
    std::string name;
    std::string category;
    int64_t ts_us;
    int64_t dur_us;
    int tid;
  };
  int rank_;
  bool enabled_;
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
};

/// RAII span: records [construction, destruction) on the tracer.
class TraceSpan {
 public:
  TraceSpan(Tracer& tracer, std::string name, std::string category = "train", int tid = 0);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Tracer& tracer_;
  std::string name_;
  std::string category_;
  int tid_;
  int64_t begin_us_;
};

}  // namespace gpt

#include "gpt/trace.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "tdist/error.h"

namespace gpt {

Tracer::Tracer(int rank, bool enabled)
    : rank_(rank), enabled_(enabled), origin_(std::chrono::steady_clock::now()) {}

int64_t Tracer::now_us() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               origin_)
      .count();
}

int64_t Tracer::origin_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(origin_.time_since_epoch()).count();
}

void Tracer::add_span(const std::string& name, const std::string& category, int64_t begin_us,
                      int64_t end_us, int tid) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({name, category, begin_us, std::max<int64_t>(0, end_us - begin_us), tid});
}

size_t Tracer::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

void Tracer::write(const std::string& path) const {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"tid", 0},
                    {"args", {{"name", "train"}}}});
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"tid", 1},
                    {"args", {{"name", "communication"}}}});
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& e : events_) {
      events.push_back({{"name", e.name},
                        {"cat", e.category},
                        {"ph", "X"},
                        {"ts", e.ts_us},
                        {"dur", e.dur_us},
                        {"pid", rank_},
                        {"tid", e.tid}});
    }
  }
  std::ofstream out(path);
  if (!out) TDIST_THROW(tdist::Error, "trace: cannot write '" + path + "'");
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
}

TraceSpan::TraceSpan(Tracer& tracer, std::string name, std::string category, int tid)
    : tracer_(tracer),
      name_(std::move(name)),
      category_(std::move(category)),
      tid_(tid),
      begin_us_(tracer.now_us()) {}

TraceSpan::~TraceSpan() {
  tracer_.add_span(name_, category_, begin_us_, tracer_.now_us(), tid_);
}

}  // namespace gpt

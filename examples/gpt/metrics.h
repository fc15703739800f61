#pragma once

// metrics.jsonl: one JSON object per line ({"step":..,"kind":"train"|"val",...}), flushed
// after each line so a crashed run keeps everything it logged.

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace gpt {

class MetricsWriter {
 public:
  /// append=true keeps the lines of an earlier run (used by --resume).
  MetricsWriter(const std::string& path, bool append);
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

/// Reads every record of a metrics.jsonl (skips malformed lines).
std::vector<nlohmann::json> read_metrics(const std::string& path);

}  // namespace gpt

#include "gpt/metrics.h"

#include "tdist/error.h"

namespace gpt {

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : path_(path), out_(path, append ? std::ios::app : std::ios::trunc) {
  if (!out_) TDIST_THROW(tdist::Error, "metrics: cannot open '" + path + "' for writing");
}

void MetricsWriter::write(const nlohmann::json& record) {
  out_ << record.dump() << "\n";
  out_.flush();
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_discarded()) records.push_back(std::move(record));
  }
  return records;
}

}  // namespace gpt

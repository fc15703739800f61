#include "tdist/detail/ddp/bucketing.h"

#include <algorithm>
#include <map>

#include "tdist/error.h"

namespace tdist::ddp {

std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(
    const std::vector<BucketEntry>& entries, const std::vector<int64_t>& bucket_size_limits) {
  TDIST_CHECK_ARG(!bucket_size_limits.empty(),
                  "compute_bucket_assignment_by_size: give at least one size limit");
  for (auto limit : bucket_size_limits) {
    TDIST_CHECK_ARG(limit > 0, "compute_bucket_assignment_by_size: size limits must be positive");
  }
  struct Open {
    std::vector<size_t> indices;
    int64_t bytes = 0;
    size_t opened_at = 0;  // order of opening, for the leftovers at the end
  };
  std::map<int64_t, Open> open;  // one open bucket per key
  std::vector<std::vector<size_t>> closed;
  size_t opened = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    auto it = open.find(entries[i].key);
    if (it == open.end()) {
      it = open.emplace(entries[i].key, Open{}).first;
      it->second.opened_at = opened++;
    }
    Open& bucket = it->second;
    bucket.indices.push_back(i);
    bucket.bytes += entries[i].bytes;
    const int64_t limit =
        bucket_size_limits[std::min(closed.size(), bucket_size_limits.size() - 1)];
    if (bucket.bytes >= limit) {
      closed.push_back(std::move(bucket.indices));
      open.erase(it);
    }
  }
  std::vector<Open> rest;
  for (auto& [key, bucket] : open) rest.push_back(std::move(bucket));
  std::sort(rest.begin(), rest.end(),
            [](const Open& a, const Open& b) { return a.opened_at < b.opened_at; });
  for (auto& bucket : rest) closed.push_back(std::move(bucket.indices));
  return closed;
}

std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(
    const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& bucket_size_limits) {
  std::vector<BucketEntry> entries;
  entries.reserve(tensors.size());
  for (const auto& t : tensors) {
    const auto device = t.device();
    const int64_t key = (static_cast<int64_t>(t.scalar_type()) << 32) |
                        (static_cast<int64_t>(device.type()) << 16) |
                        static_cast<int64_t>(device.index() + 1);
    entries.push_back({static_cast<int64_t>(t.numel() * t.element_size()), key});
  }
  return compute_bucket_assignment_by_size(entries, bucket_size_limits);
}

}  // namespace tdist::ddp

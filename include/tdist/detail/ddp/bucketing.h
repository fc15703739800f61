#pragma once

// Gradient bucket assignment (pure arithmetic, no communication).
//
// Note [DDP bucket order]: DDP hands the parameters in *reverse* registration order, since
// backward produces the gradients of the last layers first. The first bucket (the first to
// become ready) is small (1 MB by default) so that communication starts early; the others
// hold up to bucket_cap_mb (25 MB by default). Buckets never mix dtypes or devices. This is
// the layout PyTorch's reducer settles on after its first-iteration rebuild.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tdist::ddp {

/// One tensor's size and kind, as far as bucketing cares.
struct BucketEntry {
  int64_t bytes = 0;
  /// Tensors with different keys (dtype, device) never share a bucket.
  int64_t key = 0;
};

/// Splits `entries` (already in the order buckets should fill) into buckets. A bucket closes
/// as soon as its size reaches its limit: the i-th bucket closed uses limits[min(i, n-1)].
/// Returns, per bucket, the indices into `entries`, buckets in the order they closed (open
/// buckets of other keys are appended at the end in the order they were opened).
std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(
    const std::vector<BucketEntry>& entries, const std::vector<int64_t>& bucket_size_limits);

/// Convenience over tensors: byte sizes and (dtype, device) keys taken from each tensor.
std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(
    const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& bucket_size_limits);

}  // namespace tdist::ddp

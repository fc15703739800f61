#pragma once

// Boxes (offsets + sizes) of a global tensor: intersection and the byte range of one box
// inside another that is stored contiguously in row-major order.

#include <cstdint>
#include <vector>

namespace tdist::checkpoint::detail {

struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;

  int64_t numel() const;
  bool operator==(const Box& o) const { return offsets == o.offsets && sizes == o.sizes; }
  bool operator<(const Box& o) const {
    return offsets != o.offsets ? offsets < o.offsets : sizes < o.sizes;
  }
};

/// The common part of a and b; sizes all-zero-or-more, numel() == 0 when they do not meet.
Box intersect(const Box& a, const Box& b);

/// True when box lies within a tensor of `shape`.
bool box_within(const Box& box, const std::vector<int64_t>& shape);

/// `inner` (inside `outer`) as a range of elements of `outer`'s row-major storage: the
/// first and one-past-last element touched, and the strides (in elements) to view it.
struct ElementRange {
  int64_t first = 0;
  int64_t end = 0;
  std::vector<int64_t> strides;
};
ElementRange element_range(const Box& outer, const Box& inner);

}  // namespace tdist::checkpoint::detail

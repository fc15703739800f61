#include "checkpoint/box.h"

#include <algorithm>

namespace tdist::checkpoint::detail {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

Box intersect(const Box& a, const Box& b) {
  Box out;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    out.offsets.push_back(lo);
    out.sizes.push_back(std::max<int64_t>(0, hi - lo));
  }
  return out;
}

bool box_within(const Box& box, const std::vector<int64_t>& shape) {
  if (box.offsets.size() != shape.size() || box.sizes.size() != shape.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.offsets[d] < 0 || box.sizes[d] < 0 || box.offsets[d] + box.sizes[d] > shape[d]) {
      return false;
    }
  }
  return true;
}

ElementRange element_range(const Box& outer, const Box& inner) {
  const size_t dims = outer.sizes.size();
  ElementRange r;
  r.strides.assign(dims, 1);
  for (size_t d = dims; d-- > 1;) r.strides[d - 1] = r.strides[d] * outer.sizes[d];
  int64_t last = 0;
  for (size_t d = 0; d < dims; ++d) {
    r.first += (inner.offsets[d] - outer.offsets[d]) * r.strides[d];
    last += (inner.offsets[d] + inner.sizes[d] - 1 - outer.offsets[d]) * r.strides[d];
  }
  r.end = last + 1;
  return r;
}

}  // namespace tdist::checkpoint::detail

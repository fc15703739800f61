#pragma once

// Tensor checks the distributed-tensor tests share: the oracle for Shard placements (what
// at::chunk gives, independent of tdist's own shard arithmetic) and a closeness check.

#include <cstdint>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace tdist::testing {

/// Same dtype, same shape and equal values (torch.equal), as "bitwise equal" means in the
/// checkpoint and state-dict tests.
inline bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && a.equal(b);
}

/// Piece `index` of `t` split into `parts` along `dim` by at::chunk; empty past the last
/// piece (at::chunk returns fewer pieces than asked when the dimension is short).
inline at::Tensor chunk_piece(const at::Tensor& t, int64_t dim, int64_t parts, int64_t index) {
  const auto pieces = t.chunk(parts, dim);
  return index < static_cast<int64_t>(pieces.size()) ? pieces[index] : t.narrow(dim, 0, 0);
}

/// `a` is defined, shaped as `b`, and allclose to it with rtol = atol = `tolerance`.
inline void expect_close(const at::Tensor& a, const at::Tensor& b, const std::string& what,
                         double tolerance) {
  ASSERT_TRUE(a.defined()) << what << ": undefined";
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_TRUE(at::allclose(a, b, tolerance, tolerance))
      << what << ": max difference " << (a - b).abs().max().item<double>();
}

}  // namespace tdist::testing

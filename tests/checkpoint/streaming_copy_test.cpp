// The staging copy of asynchronous saves (Note [Streaming staging copies]) against copy_.

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "checkpoint/streaming_copy.h"

namespace tdist::checkpoint::streaming_copy_test {
namespace {

/// A tensor of `bytes` random bytes whose data starts `offset` bytes into an allocation, so
/// neither end falls on a cache line unless offset is 0.
at::Tensor random_bytes_at(int64_t bytes, int64_t offset) {
  at::Tensor block = at::randint(0, 256, {bytes + offset + 64}, at::kByte);
  return block.narrow(0, offset, bytes);
}

TEST(StreamingCopy, EqualsCopyAtEveryAlignmentAndAroundTheThresholds) {
  std::cout << "streaming copy on this CPU: " << detail::to_string(detail::best_streaming_kind())
            << "\n";
  const std::vector<int64_t> sizes = {1,
                                      63,
                                      (int64_t{1} << 20) - 1,
                                      int64_t{1} << 20,
                                      (int64_t{1} << 20) + 1,
                                      (int64_t{1} << 20) + 255,
                                      (int64_t{3} << 20) + 4096 + 17,
                                      (int64_t{256} << 10) * 5 + 1};
  for (const int64_t bytes : sizes) {
    for (const int64_t src_offset : {0, 1, 13, 64}) {
      for (const int64_t dst_offset : {0, 7, 32}) {
        const at::Tensor src = random_bytes_at(bytes, src_offset);
        at::Tensor backing = at::full({bytes + dst_offset + 128}, 0xAB, at::kByte);
        at::Tensor dst = backing.narrow(0, dst_offset, bytes);
        for (const auto kind : detail::available_streaming_kinds()) {
          dst.fill_(0xAB);
          detail::streaming_copy_(dst, src, kind);
          SCOPED_TRACE(std::string(detail::to_string(kind)) + ": bytes " + std::to_string(bytes) +
                       ", src offset " + std::to_string(src_offset) + ", dst offset " +
                       std::to_string(dst_offset));
          EXPECT_TRUE(dst.equal(src));
          // Nothing outside the destination is written.
          EXPECT_TRUE(backing.narrow(0, 0, dst_offset).eq(0xAB).all().item<bool>());
          EXPECT_TRUE(backing.narrow(0, dst_offset + bytes, 128).eq(0xAB).all().item<bool>());
        }
      }
    }
  }
}

TEST(StreamingCopy, EveryDtypeAndShapeCopiesBitwise) {
  for (const auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt,
                           at::kBool, at::kComplexFloat}) {
    const at::Tensor src =
        dtype == at::kBool ? at::rand({515, 1031}) > 0.5 : at::randn({515, 1031}).to(dtype);
    for (const auto kind : detail::available_streaming_kinds()) {
      at::Tensor dst = at::empty_like(src);
      detail::streaming_copy_(dst, src, kind);
      EXPECT_TRUE(dst.equal(src)) << dtype << " " << detail::to_string(kind);
    }
  }
}

TEST(StreamingCopy, WhatItCannotStreamIsCopy) {
  const at::Tensor big = at::randn({1024, 1024});
  // A transposed source, a dtype change, a conjugated view: each is copy_'s result.
  at::Tensor dst = at::empty({1024, 1024});
  detail::streaming_copy_(dst, big.t());
  EXPECT_TRUE(dst.equal(big.t()));
  at::Tensor dst_double = at::empty({1024, 1024}, at::kDouble);
  detail::streaming_copy_(dst_double, big);
  EXPECT_TRUE(dst_double.equal(big.to(at::kDouble)));
  const at::Tensor complex = at::randn({1024, 512}, at::kComplexFloat);
  at::Tensor dst_complex = at::empty_like(complex);
  detail::streaming_copy_(dst_complex, complex.conj());
  EXPECT_TRUE(dst_complex.equal(complex.conj().resolve_conj()));
  at::Tensor dst_neg = at::empty_like(big);
  detail::streaming_copy_(dst_neg, big.neg()._neg_view());
  EXPECT_TRUE(dst_neg.equal(big.neg()._neg_view().resolve_neg()));
}

}  // namespace
}  // namespace tdist::checkpoint::streaming_copy_test

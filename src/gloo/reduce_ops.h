#pragma once

// Dtype dispatch and reduce functions for the Gloo engine.
//
// Note [Reduced-precision accumulation]: float16 and bfloat16 tensors are reduced in a float32
// working copy (upcast, reduce, downcast once at the end), so partial sums never round to
// 16 bits on the way around the ring. Other dtypes are reduced in their own type.

#include <cstddef>
#include <functional>
#include <string>

#include <ATen/core/Tensor.h>

#include "tdist/comm/types.h"

namespace tdist::detail {

/// dst = a (op) b, elementwise over `numel` elements of `dtype`; dst may alias a or b.
using ReduceFn = std::function<void(void* dst, const void* a, const void* b, size_t numel)>;

/// Dtypes the Gloo engine carries.
bool gloo_supports_dtype(at::ScalarType dtype);
/// Throws InvalidArgument naming the op unless `dtype` is carried.
void check_gloo_dtype(at::ScalarType dtype, const std::string& op, int rank);
/// Throws InvalidArgument for bitwise ops on floating point, AVG on bool, and PREMUL_SUM (which
/// the front end turns into SUM, Note [PREMUL_SUM without NCCL]).
void check_reduce_op(ReduceOp op, at::ScalarType dtype, const std::string& what, int rank);

/// The dtype a reduction runs in (float32 for float16/bfloat16).
at::ScalarType accumulation_dtype(at::ScalarType dtype);

/// The elementwise combiner for `op` on `dtype` (AVG combines as SUM; see finish_average).
ReduceFn make_reduce_fn(ReduceOp op, at::ScalarType dtype);

/// dst = source(0) op source(1) op ... op source(n - 1), folded in rank order, n >= 2. Every
/// rank folds in the same order, so floating-point results are bitwise identical across ranks.
template <typename Source>
void fold_in_rank_order(const ReduceFn& fn, void* dst, int n, size_t numel, Source&& source) {
  fn(dst, source(0), source(1), numel);
  for (int p = 2; p < n; ++p) fn(dst, dst, source(p), numel);
}

/// Divides the `numel` elements at ptr by world_size in place when op is AVG (integers
/// truncate toward zero, as NCCL's average does).
void finish_average(ReduceOp op, void* ptr, size_t numel, at::ScalarType dtype, int world_size);

}  // namespace tdist::detail

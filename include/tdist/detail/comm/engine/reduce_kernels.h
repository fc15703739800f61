#pragma once

// Plain loops for the reductions that carry almost all traffic (SUM/AVG/PRODUCT on float32,
// float64, int32 and int64), for every backend's own reductions. See Note [Raw reduce
// kernels].
//
// Note [Raw reduce kernels]: ATen's add_out on a from_blob view costs a dispatch, two views
// and a TensorIterator per call and, on a worker thread, may start its own OpenMP team: with
// several ranks per core that oversubscribes the machine exactly while the ranks wait on each
// other. These loops run on the calling thread only and are compiled with -O3, in AVX-512,
// AVX2 and baseline versions on x86 (the CPU's best is picked at load time): a baseline-only
// (SSE) loop was ~15% slower (median) than ATen's AVX-512 kernel on 256 KiB folds here, the
// clones match it (bench/HISTORY.md). Each element is a[i] (op) b[i], bitwise
// what ATen computes. Used by the Gloo engine's and the MPI backend's shared-memory
// reductions. MIN/MAX stay in ATen, whose NaN propagation the loops would not reproduce.

#include <cstddef>

#include <c10/core/ScalarType.h>

#include "tdist/comm/types.h"

namespace tdist::detail {

/// dst = a (op) b over n elements; dst may alias a or b.
using RawReduceFn = void (*)(void* dst, const void* a, const void* b, size_t n);

/// The loop for (op, dtype), or nullptr when ATen must do it.
RawReduceFn raw_reduce_fn(ReduceOp op, c10::ScalarType dtype);

/// Divides n floating-point elements by `divisor` in place; false (nothing done) for other
/// dtypes.
bool raw_divide(void* ptr, size_t n, c10::ScalarType dtype, int divisor);

}  // namespace tdist::detail

#include "tdist/detail/comm/engine/reduce_kernels.h"

#include <cstdint>
#include <functional>

namespace tdist::detail {

namespace {

// Note [Raw reduce kernels]: one version per vector width, chosen when the library loads.
#if defined(__x86_64__) && defined(__GNUC__)
#define TDIST_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TDIST_VECTOR_CLONES
#endif

// The loops take restrict pointers (so the compiler vectorises them without overlap checks);
// the in-place case, which the reductions mostly are, gets its own loop.
template <typename T, typename Op>
TDIST_VECTOR_CLONES void elementwise(T* __restrict d, const T* __restrict x, const T* __restrict y,
                                     size_t n) {
  const Op op;
  for (size_t i = 0; i < n; ++i) d[i] = op(x[i], y[i]);
}

template <typename T, typename Op>
TDIST_VECTOR_CLONES void elementwise_in_place(T* __restrict d, const T* __restrict y, size_t n) {
  const Op op;
  for (size_t i = 0; i < n; ++i) d[i] = op(d[i], y[i]);
}

// dst = a (op) b; dst may be a or b (op commutes: + and * on IEEE floats and integers).
template <typename T, typename Op>
void reduce(void* dst, const void* a, const void* b, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (d == x) {
    elementwise_in_place<T, Op>(d, y, n);
  } else if (d == y) {
    elementwise_in_place<T, Op>(d, x, n);
  } else {
    elementwise<T, Op>(d, x, y, n);
  }
}

template <typename T>
TDIST_VECTOR_CLONES void divide(void* ptr, size_t n, int divisor) {
  T* p = static_cast<T*>(ptr);
  const T d = static_cast<T>(divisor);
  for (size_t i = 0; i < n; ++i) p[i] = p[i] / d;
}

template <typename T>
RawReduceFn for_type(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
      return &reduce<T, std::plus<T>>;
    case ReduceOp::PRODUCT:
      return &reduce<T, std::multiplies<T>>;
    default:
      return nullptr;
  }
}

}  // namespace

RawReduceFn raw_reduce_fn(ReduceOp op, c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return for_type<float>(op);
    case c10::ScalarType::Double:
      return for_type<double>(op);
    case c10::ScalarType::Int:
      return for_type<int32_t>(op);
    case c10::ScalarType::Long:
      return for_type<int64_t>(op);
    default:
      return nullptr;
  }
}

bool raw_divide(void* ptr, size_t n, c10::ScalarType dtype, int divisor) {
  switch (dtype) {
    case c10::ScalarType::Float:
      divide<float>(ptr, n, divisor);
      return true;
    case c10::ScalarType::Double:
      divide<double>(ptr, n, divisor);
      return true;
    default:
      return false;
  }
}

}  // namespace tdist::detail

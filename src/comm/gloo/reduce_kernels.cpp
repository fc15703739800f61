#include "comm/gloo/reduce_kernels.h"

#include <cstdint>

namespace tdist::detail {

namespace {

template <typename T>
void sum(void* dst, const void* a, const void* b, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) d[i] = x[i] + y[i];
}

template <typename T>
void product(void* dst, const void* a, const void* b, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) d[i] = x[i] * y[i];
}

template <typename T>
void divide(void* ptr, size_t n, int divisor) {
  T* p = static_cast<T*>(ptr);
  const T d = static_cast<T>(divisor);
  for (size_t i = 0; i < n; ++i) p[i] = p[i] / d;
}

template <typename T>
RawReduceFn for_type(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
      return &sum<T>;
    case ReduceOp::PRODUCT:
      return &product<T>;
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

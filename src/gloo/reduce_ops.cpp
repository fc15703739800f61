#include "gloo/reduce_ops.h"

#include <ATen/ATen.h>

#include "tdist/detail/comm/engine/reduce_kernels.h"
#include "tdist/error.h"

namespace tdist::detail {

namespace {

at::Tensor view(const void* ptr, size_t numel, at::ScalarType dtype) {
  return at::from_blob(const_cast<void*>(ptr), {static_cast<int64_t>(numel)},
                       at::TensorOptions().dtype(dtype));
}

bool is_floating(at::ScalarType dtype) {
  return at::isFloatingType(dtype);
}

}  // namespace

bool gloo_supports_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kByte:
    case at::kChar:
    case at::kInt:
    case at::kLong:
    case at::kBool:
      return true;
    default:
      return false;
  }
}

void check_gloo_dtype(at::ScalarType dtype, const std::string& op, int rank) {
  TDIST_CHECK_ARG(gloo_supports_dtype(dtype),
                  "rank " + std::to_string(rank) + ": gloo " + op + " does not support dtype " +
                      std::string(c10::toString(dtype)) +
                      "; use float32, float64, float16, bfloat16, uint8, int8, int32, int64 "
                      "or bool");
}

void check_reduce_op(ReduceOp op, at::ScalarType dtype, const std::string& what, int rank) {
  // Note [PREMUL_SUM without NCCL]: the front end scales the input and sends SUM.
  TDIST_CHECK_ARG(op != ReduceOp::PREMUL_SUM,
                  "rank " + std::to_string(rank) + ": gloo " + what +
                      " got ReduceOp PREMUL_SUM, which the engine does not apply itself; call "
                      "tdist::" +
                      what + ", which multiplies by the factor and sums");
  bool bitwise = op == ReduceOp::BAND || op == ReduceOp::BOR || op == ReduceOp::BXOR;
  TDIST_CHECK_ARG(!(bitwise && is_floating(dtype)),
                  "rank " + std::to_string(rank) + ": gloo " + what + " with ReduceOp " +
                      to_string(op) + " needs an integer or bool tensor, got " +
                      std::string(c10::toString(dtype)) + "; use SUM/PRODUCT/MIN/MAX/AVG");
  TDIST_CHECK_ARG(!(op == ReduceOp::AVG && dtype == at::kBool),
                  "rank " + std::to_string(rank) + ": gloo " + what +
                      " with ReduceOp AVG is undefined for bool tensors; use BOR/BAND/MIN/MAX");
}

at::ScalarType accumulation_dtype(at::ScalarType dtype) {
  return (dtype == at::kHalf || dtype == at::kBFloat16) ? at::kFloat : dtype;
}

ReduceFn make_reduce_fn(ReduceOp op, at::ScalarType dtype) {
  if (RawReduceFn raw = raw_reduce_fn(op, dtype)) return raw;
  const bool is_bool = dtype == at::kBool;
  using Out = void (*)(at::Tensor&, const at::Tensor&, const at::Tensor&);
  Out out = nullptr;
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
      out = is_bool ? +[](at::Tensor& d, const at::Tensor& a,
                          const at::Tensor& b) { at::logical_or_out(d, a, b); }
                    : +[](at::Tensor& d, const at::Tensor& a, const at::Tensor& b) {
                        at::add_out(d, a, b);
                      };
      break;
    case ReduceOp::PRODUCT:
      out = is_bool ? +[](at::Tensor& d, const at::Tensor& a,
                          const at::Tensor& b) { at::logical_and_out(d, a, b); }
                    : +[](at::Tensor& d, const at::Tensor& a, const at::Tensor& b) {
                        at::mul_out(d, a, b);
                      };
      break;
    case ReduceOp::MIN:
      out = is_bool ? +[](at::Tensor& d, const at::Tensor& a,
                          const at::Tensor& b) { at::logical_and_out(d, a, b); }
                    : +[](at::Tensor& d, const at::Tensor& a, const at::Tensor& b) {
                        at::minimum_out(d, a, b);
                      };
      break;
    case ReduceOp::MAX:
      out = is_bool ? +[](at::Tensor& d, const at::Tensor& a,
                          const at::Tensor& b) { at::logical_or_out(d, a, b); }
                    : +[](at::Tensor& d, const at::Tensor& a, const at::Tensor& b) {
                        at::maximum_out(d, a, b);
                      };
      break;
    case ReduceOp::BAND:
      out = +[](at::Tensor& d, const at::Tensor& a, const at::Tensor& b) {
        at::bitwise_and_out(d, a, b);
      };
      break;
    case ReduceOp::BOR:
      out = +[](at::Tensor& d, const at::Tensor& a, const at::Tensor& b) {
        at::bitwise_or_out(d, a, b);
      };
      break;
    case ReduceOp::BXOR:
      out = +[](at::Tensor& d, const at::Tensor& a, const at::Tensor& b) {
        at::bitwise_xor_out(d, a, b);
      };
      break;
    case ReduceOp::PREMUL_SUM:
      TDIST_THROW(InvalidArgument,
                  "gloo: ReduceOp PREMUL_SUM has no combiner (check_reduce_op "
                  "refuses it)");
  }
  return [out, dtype](void* dst, const void* a, const void* b, size_t numel) {
    if (numel == 0) return;
    at::Tensor d = view(dst, numel, dtype);
    out(d, view(a, numel, dtype), view(b, numel, dtype));
  };
}

void finish_average(ReduceOp op, void* ptr, size_t numel, at::ScalarType dtype, int world_size) {
  if (op != ReduceOp::AVG || numel == 0 || world_size == 1) return;
  if (raw_divide(ptr, numel, dtype, world_size)) return;
  at::Tensor t = view(ptr, numel, dtype);
  if (is_floating(dtype)) {
    t.div_(world_size);
  } else {
    t.copy_(at::div(t, world_size, "trunc"));
  }
}

}  // namespace tdist::detail

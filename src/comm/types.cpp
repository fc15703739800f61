#include "tdist/comm/types.h"

#include <ATen/Functions.h>

#include "tdist/error.h"

namespace tdist {

ReduceOp ReduceOp::from_code(int code) {
  TDIST_CHECK_ARG(code >= 0 && code <= static_cast<int>(Kind::PREMUL_SUM),
                  "ReduceOp code " + std::to_string(code) + " names no reduce operation");
  return ReduceOp(static_cast<Kind>(code));
}

double ReduceOp::scalar_factor() const {
  return factor_ && !factor_->tensor.defined() ? factor_->scalar : 1.0;
}

const at::Tensor& ReduceOp::tensor_factor() const {
  static const at::Tensor kNone;
  return factor_ ? factor_->tensor : kNone;
}

at::Tensor ReduceOp::factor_like(const at::Tensor& like) const {
  TDIST_CHECK_ARG(has_factor(), "ReduceOp " + to_string(*this) + " carries no factor");
  const at::TensorOptions options = like.options();
  if (factor_->tensor.defined()) return factor_->tensor.reshape({}).to(options);
  return at::scalar_tensor(factor_->scalar, options);
}

ReduceOp make_nccl_premul_sum(double factor) {
  ReduceOp op(ReduceOp::PREMUL_SUM);
  auto f = std::make_shared<ReduceOp::Factor>();
  f->scalar = factor;
  op.factor_ = std::move(f);
  return op;
}

ReduceOp make_nccl_premul_sum(const at::Tensor& factor) {
  TDIST_CHECK_ARG(factor.defined(), "make_nccl_premul_sum: the factor tensor is undefined");
  TDIST_CHECK_ARG(factor.numel() == 1, "make_nccl_premul_sum: the factor tensor has " +
                                           std::to_string(factor.numel()) +
                                           " elements; PREMUL_SUM takes one factor (a "
                                           "one-element tensor or a scalar)");
  TDIST_CHECK_ARG(at::isFloatingType(factor.scalar_type()),
                  "make_nccl_premul_sum: the factor tensor has dtype " +
                      std::string(c10::toString(factor.scalar_type())) +
                      "; PREMUL_SUM takes a real floating factor (float16, bfloat16, float32, "
                      "float64)");
  ReduceOp op(ReduceOp::PREMUL_SUM);
  auto f = std::make_shared<ReduceOp::Factor>();
  f->tensor = factor.detach();
  op.factor_ = std::move(f);
  return op;
}

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
      return "SUM";
    case ReduceOp::AVG:
      return "AVG";
    case ReduceOp::PRODUCT:
      return "PRODUCT";
    case ReduceOp::MIN:
      return "MIN";
    case ReduceOp::MAX:
      return "MAX";
    case ReduceOp::BAND:
      return "BAND";
    case ReduceOp::BOR:
      return "BOR";
    case ReduceOp::BXOR:
      return "BXOR";
    case ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
  }
  return "UNKNOWN(" + std::to_string(op.code()) + ")";
}

}  // namespace tdist

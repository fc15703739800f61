#pragma once

// The expected result of a reduction, computed in one process from every rank's input: in
// double for arithmetic ops (exact for the small integers the tests use), in int64 for the
// bitwise ones, logical ops for bool.

#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tdist/comm/types.h"

namespace tdist::mpi::testing {

inline at::Tensor reduce_locally(const std::vector<at::Tensor>& inputs, tdist::ReduceOp op) {
  auto dtype = inputs.front().scalar_type();
  if (dtype == at::kBool) {
    auto acc = inputs.front().clone();
    for (size_t k = 1; k < inputs.size(); ++k) {
      const auto& t = inputs[k];
      switch (op) {
        case tdist::ReduceOp::SUM:
        case tdist::ReduceOp::MAX:
        case tdist::ReduceOp::BOR:
          acc = acc.logical_or(t);
          break;
        case tdist::ReduceOp::PRODUCT:
        case tdist::ReduceOp::MIN:
        case tdist::ReduceOp::BAND:
          acc = acc.logical_and(t);
          break;
        case tdist::ReduceOp::BXOR:
          acc = acc.logical_xor(t);
          break;
        default:
          ADD_FAILURE() << "op not valid for bool";
      }
    }
    return acc;
  }
  auto acc = inputs.front().to(torch::kLong);
  const bool integral = !at::isFloatingType(dtype);
  auto acc_d = inputs.front().to(torch::kDouble);
  for (size_t k = 1; k < inputs.size(); ++k) {
    auto t = inputs[k].to(torch::kDouble);
    auto ti = inputs[k].to(torch::kLong);
    switch (op) {
      case tdist::ReduceOp::SUM:
      case tdist::ReduceOp::AVG:
        acc_d = acc_d + t;
        break;
      case tdist::ReduceOp::PRODUCT:
        acc_d = acc_d * t;
        break;
      case tdist::ReduceOp::MIN:
        acc_d = torch::minimum(acc_d, t);
        break;
      case tdist::ReduceOp::MAX:
        acc_d = torch::maximum(acc_d, t);
        break;
      case tdist::ReduceOp::BAND:
        acc = acc.bitwise_and(ti);
        break;
      case tdist::ReduceOp::BOR:
        acc = acc.bitwise_or(ti);
        break;
      case tdist::ReduceOp::BXOR:
        acc = acc.bitwise_xor(ti);
        break;
      case tdist::ReduceOp::PREMUL_SUM:
        ADD_FAILURE() << "reduce_locally has no PREMUL_SUM (it carries a factor)";
        break;
    }
  }
  if (op == tdist::ReduceOp::AVG) acc_d = acc_d / static_cast<double>(inputs.size());
  if (integral &&
      (op == tdist::ReduceOp::BAND || op == tdist::ReduceOp::BOR || op == tdist::ReduceOp::BXOR)) {
    return acc.to(dtype);
  }
  return acc_d.to(dtype);
}

}  // namespace tdist::mpi::testing

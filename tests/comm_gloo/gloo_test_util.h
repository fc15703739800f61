#pragma once

// Helpers for the Gloo engine tests: rank-dependent inputs and independently computed
// expectations (in int64/double, folded over ranks), and a harness that gives each rank
// thread its own GlooBackend.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "support/ranks.h"
#include "tdist/gloo/gloo_backend.h"

namespace tdist::testing {

using gloo::gloo_options_from_env;
using gloo::GlooBackend;
using gloo::GlooBackendOptions;

inline const std::vector<at::ScalarType>& all_dtypes() {
  static const std::vector<at::ScalarType> d = {at::kFloat,    at::kDouble, at::kHalf,
                                                at::kBFloat16, at::kByte,   at::kChar,
                                                at::kInt,      at::kLong,   at::kBool};
  return d;
}

inline const std::vector<ReduceOp>& all_ops() {
  static const std::vector<ReduceOp> o = {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::PRODUCT,
                                          ReduceOp::MIN, ReduceOp::MAX, ReduceOp::BAND,
                                          ReduceOp::BOR, ReduceOp::BXOR};
  return o;
}

/// Whether `op` is defined on `dtype` (bitwise ops need integers/bool; AVG no bool).
inline bool op_valid(ReduceOp op, at::ScalarType dtype) {
  bool bitwise = op == ReduceOp::BAND || op == ReduceOp::BOR || op == ReduceOp::BXOR;
  if (bitwise && at::isFloatingType(dtype)) return false;
  if (op == ReduceOp::AVG && dtype == at::kBool) return false;
  return true;
}

/// Rank r's input: small positive values (exact in every dtype), bool a pattern.
inline at::Tensor rank_input(int rank, int64_t numel, at::ScalarType dtype, int salt = 0) {
  auto i = torch::arange(numel, torch::kLong);
  at::Tensor v = dtype == at::kBool ? ((i + rank + salt) % 3 == 0).to(torch::kLong)
                                    : (i + salt) % 5 + rank + 1;
  return v.to(dtype);
}

/// Fold of op over ranks' inputs, computed in int64/double, then cast to dtype.
inline at::Tensor expected_reduce(int world, int64_t numel, at::ScalarType dtype, ReduceOp op,
                                  int salt = 0) {
  const bool fp = at::isFloatingType(dtype);
  const auto wide = fp ? torch::kDouble : torch::kLong;
  at::Tensor acc = rank_input(0, numel, dtype, salt).to(wide);
  for (int r = 1; r < world; ++r) {
    at::Tensor x = rank_input(r, numel, dtype, salt).to(wide);
    switch (op) {
      case ReduceOp::SUM:
      case ReduceOp::AVG:
        acc = dtype == at::kBool ? torch::maximum(acc, x) : acc + x;
        break;
      case ReduceOp::PRODUCT:
        acc = acc * x;
        break;
      case ReduceOp::MIN:
        acc = torch::minimum(acc, x);
        break;
      case ReduceOp::MAX:
        acc = torch::maximum(acc, x);
        break;
      case ReduceOp::BAND:
        acc = torch::bitwise_and(acc, x);
        break;
      case ReduceOp::BOR:
        acc = torch::bitwise_or(acc, x);
        break;
      case ReduceOp::BXOR:
        acc = torch::bitwise_xor(acc, x);
        break;
      case ReduceOp::PREMUL_SUM:
        ADD_FAILURE() << "expected_reduce has no PREMUL_SUM (it carries a factor)";
        break;
    }
  }
  if (op == ReduceOp::AVG) acc = fp ? acc / world : torch::div(acc, world, "trunc");
  if (dtype == at::kBool) return acc.ne(0);
  return acc.to(dtype);
}

/// Exact for integers and bool; for floats within the dtype's rounding.
inline void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  bool ok;
  if (at::isFloatingType(got.scalar_type())) {
    double tol =
        (got.scalar_type() == at::kHalf || got.scalar_type() == at::kBFloat16) ? 1e-2 : 1e-6;
    ok = torch::allclose(got.to(torch::kDouble).reshape({-1}),
                         want.to(torch::kDouble).reshape({-1}), tol, tol);
  } else {
    ok = torch::equal(got.reshape({-1}), want.reshape({-1}));
  }
  EXPECT_TRUE(ok) << what << "\n got: " << got.reshape({-1}).slice(0, 0, 12)
                  << "\n want: " << want.reshape({-1}).slice(0, 0, 12);
}

inline std::string label(const std::string& op, int world, at::ScalarType dtype,
                         ReduceOp rop = ReduceOp::SUM, int64_t numel = 0) {
  return op + " world=" + std::to_string(world) + " dtype=" + c10::toString(dtype) +
         " op=" + to_string(rop) + " numel=" + std::to_string(numel);
}

/// Runs fn on world_size threads, each with its own GlooBackend over a shared HashStore.
inline void run_gloo(int world_size,
                     const std::function<void(GlooBackend& backend, int rank, int world)>& fn,
                     GlooBackendOptions options = {},
                     std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  run_ranks_as_threads(world_size, [&](int rank, int world, StorePtr store) {
    GlooBackend backend(store, rank, world, timeout, options);
    fn(backend, rank, world);
  });
}

}  // namespace tdist::testing

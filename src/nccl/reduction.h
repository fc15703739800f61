#pragma once

// The NCCL reduction of one collective (c10d's ncclRedOpRAII): one of NCCL's built-in ops,
// or for ReduceOp PREMUL_SUM an op made on the communicator with the call's factor
// (ncclRedOpCreatePreMulSum) and destroyed once the call is issued, which NCCL allows as soon
// as the last call using it has returned.

#include <nccl.h>

#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/comm/types.h"

namespace tdist::nccl::detail {

class Reduction {
 public:
  /// Checks `op` for tensors like `like` before anything is issued (InvalidArgument): a
  /// built-in op NCCL has for the dtype, or PREMUL_SUM with its factor on a float16,
  /// bfloat16, float32 or float64 tensor (c10d's list). A tensor factor is copied to
  /// `like`'s device and dtype here, on the caller's current stream, where NCCL reads it
  /// when the kernel runs; a scalar one travels with the op (ncclScalarHostImmediate).
  Reduction(const ReduceOp& op, const at::Tensor& like);

  /// Tensors the collective must keep in use until it completes (the device factor).
  const std::vector<at::Tensor>& tensors() const { return tensors_; }

  /// The op for one call on `comm`, valid while it lives; made and destroyed inside the
  /// collective's body, under the communicator's lease.
  class Scoped {
   public:
    Scoped(const Reduction& reduction, ncclComm_t comm);
    ~Scoped();
    Scoped(const Scoped&) = delete;
    Scoped& operator=(const Scoped&) = delete;
    ncclRedOp_t get() const { return op_; }

   private:
    ncclComm_t comm_;
    ncclRedOp_t op_;
    bool made_ = false;
  };

 private:
  ncclRedOp_t builtin_ = ncclSum;
  bool premul_ = false;
  ncclDataType_t type_ = ncclFloat32;
  at::Tensor factor_;  // PREMUL_SUM: on the device, or a host scalar of the tensor's dtype
  std::vector<at::Tensor> tensors_;
};

}  // namespace tdist::nccl::detail

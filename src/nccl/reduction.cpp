#include "nccl/reduction.h"

#include <ATen/ATen.h>

#include "nccl/nccl_types.h"
#include "tdist/error.h"

namespace tdist::nccl::detail {

Reduction::Reduction(const ReduceOp& op, const at::Tensor& like) {
  const c10::ScalarType type = like.scalar_type();
  if (op != ReduceOp::PREMUL_SUM) {
    builtin_ = nccl_reduce_op(op, type);
    return;
  }
  TDIST_CHECK_ARG(op.has_factor(),
                  "nccl: ReduceOp PREMUL_SUM needs its factor; pass "
                  "make_nccl_premul_sum(factor)");
  if (type != c10::kHalf && type != c10::kBFloat16 && type != c10::kFloat && type != c10::kDouble) {
    TDIST_THROW(InvalidArgument, std::string("nccl: PREMUL_SUM of ") + c10::toString(type) +
                                     " tensors is not supported; its data type must be "
                                     "float16, bfloat16, float32 or float64 (as c10d's)");
  }
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 11, 0)
  TDIST_THROW(InvalidArgument, "nccl: PREMUL_SUM needs NCCL 2.11 or newer (this build has " +
                                   std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) +
                                   ")");
#endif
  premul_ = true;
  type_ = nccl_dtype(type);
  if (op.tensor_factor().defined()) {
    factor_ = op.factor_like(like).contiguous();
    tensors_.push_back(factor_);
  } else {
    factor_ = op.factor_like(at::empty({0}, like.options().device(c10::kCPU)));
  }
}

Reduction::Scoped::Scoped(const Reduction& reduction, ncclComm_t comm)
    : comm_(comm), op_(reduction.builtin_) {
  if (!reduction.premul_) return;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 11, 0)
  const bool on_device = !reduction.factor_.is_cpu();
  const ncclResult_t r =
      ncclRedOpCreatePreMulSum(&op_, reduction.factor_.data_ptr(), reduction.type_,
                               on_device ? ncclScalarDevice : ncclScalarHostImmediate, comm);
  if (r != ncclSuccess) {
    TDIST_THROW(DistBackendError,
                "nccl: ncclRedOpCreatePreMulSum failed: " + nccl_error_text(r, comm));
  }
  made_ = true;
#endif
}

Reduction::Scoped::~Scoped() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 11, 0)
  if (made_) ncclRedOpDestroy(op_, comm_);
#endif
}

}  // namespace tdist::nccl::detail

#include "mpi/mpi_types.h"

#include <c10/core/ScalarType.h>

#include "tdist/error.h"

namespace tdist::mpi::detail {

MPI_Datatype mpi_datatype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kByte:
      return MPI_UNSIGNED_CHAR;
    case at::kChar:
      return MPI_SIGNED_CHAR;
    case at::kInt:
      return MPI_INT32_T;
    case at::kLong:
      return MPI_INT64_T;
    case at::kBool:
      return MPI_C_BOOL;
    case at::kHalf:
    case at::kBFloat16:
      // Moved as raw 16-bit words when nothing is reduced.
      return MPI_UINT16_T;
    default:
      TDIST_THROW(InvalidArgument, std::string("mpi: dtype ") + c10::toString(dtype) +
                                       " is not supported (float32/64, float16, bfloat16, "
                                       "uint8, int8, int32, int64, bool are)");
  }
}

bool reduced_in_fp32(at::ScalarType dtype) {
  return dtype == at::kHalf || dtype == at::kBFloat16;
}

MPI_Op mpi_op(ReduceOp op, at::ScalarType dtype) {
  const bool floating = at::isFloatingType(dtype);
  const bool boolean = dtype == at::kBool;
  switch (op) {
    case ReduceOp::SUM:
      return boolean ? MPI_LOR : MPI_SUM;
    case ReduceOp::AVG:
      TDIST_CHECK_ARG(floating, std::string("mpi: ReduceOp AVG needs a floating tensor, got ") +
                                    c10::toString(dtype) + "; use SUM and divide");
      return MPI_SUM;
    case ReduceOp::PRODUCT:
      return boolean ? MPI_LAND : MPI_PROD;
    case ReduceOp::MIN:
      return boolean ? MPI_LAND : MPI_MIN;
    case ReduceOp::MAX:
      return boolean ? MPI_LOR : MPI_MAX;
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
      TDIST_CHECK_ARG(!floating, "mpi: " + to_string(op) +
                                     " is defined for integer and bool tensors only, got " +
                                     c10::toString(dtype));
      if (boolean)
        return op == ReduceOp::BAND ? MPI_LAND : op == ReduceOp::BOR ? MPI_LOR : MPI_LXOR;
      return op == ReduceOp::BAND ? MPI_BAND : op == ReduceOp::BOR ? MPI_BOR : MPI_BXOR;
    case ReduceOp::PREMUL_SUM:
      // Note [PREMUL_SUM without NCCL]: the front end scales the input and sends SUM.
      TDIST_THROW(InvalidArgument,
                  "mpi: ReduceOp PREMUL_SUM is not applied by the backend itself; call "
                  "tdist::all_reduce/reduce/reduce_scatter, which multiply by the factor and sum");
  }
  TDIST_THROW(InvalidArgument, "mpi: unknown ReduceOp");
}

void Staged::copy_back() const {
  if (!buffer.is_same(original)) original.copy_(buffer);
}

Staged stage(const at::Tensor& tensor, bool for_reduction) {
  TDIST_CHECK_ARG(tensor.defined(), "mpi: undefined tensor");
  TDIST_CHECK_ARG(tensor.device().is_cpu(),
                  "mpi: tensors must be on the CPU (this MPI build is not CUDA-aware), got " +
                      tensor.device().str());
  mpi_datatype(tensor.scalar_type());  // validates the dtype
  if (for_reduction && reduced_in_fp32(tensor.scalar_type())) {
    return Staged{tensor, tensor.to(at::kFloat).contiguous()};
  }
  if (tensor.is_contiguous()) return Staged{tensor, tensor};
  return Staged{tensor, tensor.contiguous()};
}

}  // namespace tdist::mpi::detail

#include "nccl/nccl_types.h"

#include "tdist/error.h"

namespace tdist::nccl::detail {

ncclDataType_t nccl_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::kFloat:
      return ncclFloat32;
    case c10::kDouble:
      return ncclFloat64;
    case c10::kHalf:
      return ncclFloat16;
    case c10::kBFloat16:
      return ncclBfloat16;
    case c10::kChar:
      return ncclInt8;
    case c10::kByte:
    case c10::kBool:  // one byte per element in LibTorch
      return ncclUint8;
    case c10::kInt:
      return ncclInt32;
    case c10::kLong:
      return ncclInt64;
    default:
      TDIST_THROW(InvalidArgument,
                  std::string("nccl: dtype ") + c10::toString(type) +
                      " is not supported; NCCL takes float32, float64, float16, bfloat16, "
                      "int8, uint8, int32, int64 and bool");
  }
}

ncclRedOp_t nccl_reduce_op(ReduceOp op, c10::ScalarType type) {
  const bool is_bool = type == c10::kBool;
  switch (op) {
    case ReduceOp::SUM:
      return is_bool ? ncclMax : ncclSum;
    case ReduceOp::PRODUCT:
      return is_bool ? ncclMin : ncclProd;
    case ReduceOp::MIN:
      return ncclMin;
    case ReduceOp::MAX:
      return ncclMax;
    case ReduceOp::AVG:
      if (!c10::isFloatingType(type)) {
        TDIST_THROW(InvalidArgument, std::string("nccl: ReduceOp.AVG of ") + c10::toString(type) +
                                         " tensors is not defined (an integer mean would "
                                         "truncate); reduce with SUM and divide, or use a "
                                         "floating dtype");
      }
      return ncclAvg;
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
      break;
    case ReduceOp::PREMUL_SUM:
      TDIST_THROW(InvalidArgument,
                  "nccl: ReduceOp.PREMUL_SUM is made per call with its factor "
                  "(nccl::detail::Reduction), not mapped to a built-in op");
  }
  TDIST_THROW(InvalidArgument, "nccl: ReduceOp." + to_string(op) +
                                   " is not supported by NCCL; reduce these tensors on CPU "
                                   "with gloo (backend \"cpu:gloo,cuda:nccl\")");
}

std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = std::string("NCCL error '") + ncclGetErrorString(result) + "' (" +
                     std::to_string(static_cast<int>(result)) + ")";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += ": " + std::string(last);
  return text;
}

}  // namespace tdist::nccl::detail

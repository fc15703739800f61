#pragma once

// tdist's dtypes and reduce ops in NCCL's terms. Pure functions: they need nccl.h, not a GPU,
// so their unit tests run on every machine.

#include <nccl.h>

#include <string>

#include <c10/core/ScalarType.h>

#include "tdist/comm/types.h"

namespace tdist::nccl::detail {

/// NCCL's type for `type`; throws InvalidArgument naming the dtype and the ones NCCL takes.
ncclDataType_t nccl_dtype(c10::ScalarType type);

/// NCCL's reduction for `op` on `type`, as c10d maps them: AVG is NCCL's native ncclAvg
/// (floating types only), a bool SUM is a logical or (ncclMax) and a bool PRODUCT a logical
/// and (ncclMin); BAND/BOR/BXOR, which NCCL lacks, throw InvalidArgument naming gloo.
/// PREMUL_SUM is no built-in op: Reduction (nccl/reduction.h) makes it per call.
ncclRedOp_t nccl_reduce_op(ReduceOp op, c10::ScalarType type);

/// "NCCL error 'unhandled cuda error' (1): <last error>" for messages.
std::string nccl_error_text(ncclResult_t result, ncclComm_t comm = nullptr);

}  // namespace tdist::nccl::detail

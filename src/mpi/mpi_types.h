#pragma once

// Mapping of tensor dtypes and reduce ops onto MPI's, and the staging of tensors MPI cannot
// reduce directly (fp16/bf16 go through fp32 so reductions accumulate in fp32).

#include <mpi.h>

#include <ATen/core/Tensor.h>

#include "tdist/comm/types.h"

namespace tdist::mpi::detail {

/// The MPI datatype of a dtype MPI can move as is; throws InvalidArgument otherwise.
MPI_Datatype mpi_datatype(at::ScalarType dtype);

/// True for dtypes that are reduced in fp32 (half, bfloat16).
bool reduced_in_fp32(at::ScalarType dtype);

/// The MPI op for `op` on `dtype` (AVG maps to SUM; the caller divides). Throws
/// InvalidArgument for bitwise ops on floating tensors and AVG on integer tensors.
MPI_Op mpi_op(ReduceOp op, at::ScalarType dtype);

/// A contiguous buffer MPI may read and write for `tensor`: the tensor itself when it is
/// contiguous and of an MPI dtype, else a staged copy (fp32 for reductions of half/bf16).
struct Staged {
  at::Tensor original;
  at::Tensor buffer;
  /// Writes `buffer` back into `original` when they differ (after the op).
  void copy_back() const;
};
Staged stage(const at::Tensor& tensor, bool for_reduction);

}  // namespace tdist::mpi::detail

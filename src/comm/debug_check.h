#pragma once

// Internal: TDIST_DEBUG=DETAIL. Before each collective the ranks of the group exchange a
// small fixed-size fingerprint of the call (op, dtype, shape, root, reduce op) through the
// group's own backend; any difference raises on every rank, naming both sides, instead of
// hanging or computing on mismatched buffers.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/comm/process_group.h"
#include "tdist/comm/types.h"

namespace tdist::detail {

struct CallSignature {
  std::string op;
  int64_t dtype = -1;          // static_cast<int64_t>(ScalarType), -1 when none
  std::vector<int64_t> shape;  // what every rank must agree on
  bool check_shape = true;
  int root = -1;       // group rank, -1 when the op has none
  int reduce_op = -1;  // ReduceOp::code(), -1 when none
};

/// The signature of a call on `tensor` (undefined: no dtype, no shape).
CallSignature signature_of(std::string op, const at::Tensor& tensor, bool check_shape, int root,
                           int reduce_op);

/// Exchanges the signature across the group; throws DistBackendError on every rank when
/// they differ. Only called when pg.debug_detail().
void check_call_signature(ProcessGroup& pg, const CallSignature& signature);

}  // namespace tdist::detail

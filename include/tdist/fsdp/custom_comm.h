#pragma once

// FSDP2's custom collectives (torch.distributed.fsdp's Comm, AllGather, ReduceScatter): a
// module's all-gather and reduce-scatter may be run by user code, which also allocates their
// buffers (e.g. from a special memory pool, or to run them by another algorithm or over
// another transport).
//
//   struct MyAllGather : tdist::fsdp::AllGather {
//     tdist::WorkPtr operator()(const at::Tensor& output, const at::Tensor& input,
//                               const tdist::ProcessGroupPtr& group, bool async_op) override {
//       return tdist::all_gather_into_tensor(output, input, group, async_op);
//     }
//   };
//   block.set_custom_all_gather(std::make_shared<MyAllGather>());

#include <memory>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include "tdist/comm/process_group.h"
#include "tdist/comm/types.h"
#include "tdist/comm/work.h"

namespace tdist::fsdp {

/// Allocates a collective's buffers. The default is at::empty.
class Comm {
 public:
  virtual ~Comm() = default;
  /// A contiguous tensor of `size`, `dtype` and `device` (anything else is refused, naming
  /// the module).
  virtual at::Tensor allocate(c10::IntArrayRef size, c10::ScalarType dtype, c10::Device device);
};

/// Runs a module's all-gather: `output` ([world * n], from allocate) receives every rank's
/// `input` ([n], this rank's shards, a view of `output` at offset rank * n as in PyTorch, or a
/// post-forward slab of a smaller group, Note [Reshard to a smaller group]), rank-major.
/// Returns the Work to wait (or null when already complete).
class AllGather : public Comm {
 public:
  virtual WorkPtr operator()(const at::Tensor& output, const at::Tensor& input,
                             const ProcessGroupPtr& group, bool async_op) = 0;
};

/// Runs a module's reduce-scatter: `output` ([n], from allocate) receives the `op`-reduction
/// over the ranks of block `rank` of `input` ([world * n], from allocate, rank-major). FSDP
/// divides afterwards as it would after its own (the mean over the data-parallel ranks).
/// Returns the Work to wait (or null when already complete).
class ReduceScatter : public Comm {
 public:
  virtual WorkPtr operator()(const at::Tensor& output, const at::Tensor& input,
                             const ProcessGroupPtr& group, ReduceOp op, bool async_op) = 0;
};

}  // namespace tdist::fsdp

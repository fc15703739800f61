#pragma once

// DDP communication hooks (torch.distributed.algorithms.ddp_comm_hooks): a hook receives a
// ready gradient bucket and returns a future of the bucket's reduced, averaged gradient.
// DDP calls the hook once per bucket during backward, and waits the futures at its end.
//
//   ddp.register_comm_hook(tdist::ddp::fp16_compress_hook);
//   ddp.register_comm_hook([state](tdist::ddp::GradBucket& b) { ... return future; });

#include <chrono>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/comm/process_group.h"
#include "tdist/comm/work.h"

namespace tdist::ddp {

/// One bucket of gradients, flattened into buffer() (in bucket order).
class GradBucket {
 public:
  GradBucket(size_t index, bool is_last, at::Tensor buffer, std::vector<at::Tensor> gradients,
             std::vector<at::Tensor> parameters, ProcessGroupPtr process_group)
      : index_(index),
        is_last_(is_last),
        buffer_(std::move(buffer)),
        gradients_(std::move(gradients)),
        parameters_(std::move(parameters)),
        process_group_(std::move(process_group)) {}

  size_t index() const { return index_; }
  /// True for the bucket DDP reduces last in the iteration.
  bool is_last() const { return is_last_; }
  /// The flat gradient buffer; a hook may reduce it in place.
  const at::Tensor& buffer() const { return buffer_; }
  /// Views of buffer(), one per parameter, shaped like the parameters.
  const std::vector<at::Tensor>& gradients() const { return gradients_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  /// The group DDP reduces over (never null).
  const ProcessGroupPtr& process_group() const { return process_group_; }

 private:
  size_t index_;
  bool is_last_;
  at::Tensor buffer_;
  std::vector<at::Tensor> gradients_;
  std::vector<at::Tensor> parameters_;
  ProcessGroupPtr process_group_;
};

/// The pending result of a hook: the collective's Work (may be null when nothing is in
/// flight) and a continuation that runs after it and returns the reduced flat gradient
/// (same numel and dtype as the bucket's buffer).
class CommHookFuture {
 public:
  CommHookFuture(WorkPtr work, std::function<at::Tensor()> then)
      : work_(std::move(work)), then_(std::move(then)) {}
  /// A future that is already complete.
  static CommHookFuture ready(at::Tensor value);

  /// Waits for the Work (TimeoutError after `timeout`; negative: forever), then returns the
  /// continuation's tensor.
  at::Tensor wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));

 private:
  WorkPtr work_;
  std::function<at::Tensor()> then_;
};

using CommHook = std::function<CommHookFuture(GradBucket&)>;

/// The default: all-reduce the bucket and divide by the group size (averaging).
CommHookFuture allreduce_hook(GradBucket& bucket);
/// Casts the bucket to float16 before the all-reduce (half the bytes), back afterwards.
CommHookFuture fp16_compress_hook(GradBucket& bucket);
/// Same with bfloat16 (wider range than float16, less precision).
CommHookFuture bf16_compress_hook(GradBucket& bucket);

}  // namespace tdist::ddp

#pragma once

// The gradient reducer behind DistributedDataParallel: buckets, autograd hooks, and the
// end-of-backward finalisation. Internal.
//
// Lifecycle of one synchronised iteration:
//   prepare_for_backward()   (DDP forward)  -> every bucket pending
//   on_grad_ready(i)         (autograd post hook of param i, after its .grad is final)
//       copies .grad into its bucket; a full bucket launches, strictly in bucket order
//   finalize_backward()      (autograd engine callback at the end of backward)
//       launches what remains (zero-filled unused params if find_unused_parameters),
//       waits every bucket and writes the averaged gradients back into .grad.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include "tdist/comm/process_group.h"
#include "tdist/ddp/comm_hooks.h"

namespace tdist::ddp::detail {

struct Bucket {
  std::vector<size_t> params;     // indices into the reducer's parameters
  std::vector<int64_t> offsets;   // element offset of each param in `buffer`
  at::Tensor buffer;              // flat gradients
  std::vector<at::Tensor> views;  // one view of `buffer` per param, shaped like it
  size_t pending = 0;             // params not yet ready this iteration
  std::optional<CommHookFuture> future;
};

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
          std::vector<std::vector<size_t>> bucket_indices, ProcessGroupPtr group,
          bool find_unused_parameters, bool gradient_as_bucket_view, bool static_graph);
  ~Reducer();
  /// Installs the autograd hooks; call once right after construction (needs shared_from_this).
  void install_hooks();

  /// Expect exactly one backward that synchronises gradients.
  void prepare_for_backward();
  /// The next backward (if any) does not synchronise (no_sync, eval).
  void expect_no_backward() {
    expect_hooks_ = false;
    reduced_ = false;
  }
  void set_comm_hook(CommHook hook);
  /// Gradients are divided by the group size by the hooks; with a different divisor (Join
  /// with divide_by_initial_world_size=false) they are rescaled by size/divisor.
  void set_divisor(int divisor) { divisor_ = divisor; }

  /// For a joined rank (Join main hook): issues the same collectives as one synchronised
  /// backward with zero gradients and writes the reduced result into .grad, so that the
  /// joined rank's parameters stay in step with the others.
  void shadow_backward();

  const std::vector<Bucket>& buckets() const { return buckets_; }

  /// Called by the autograd post hook of parameter `index` once its .grad is final.
  void on_grad_ready(size_t index);

 private:
  void mark_ready(size_t index);
  /// A parameter without a gradient this backward: its slot in the bucket holds zeros.
  void mark_ready_with_zeros(size_t index);
  void launch_ready_buckets();
  void launch(size_t bucket_index);
  void finalize_backward();
  /// Waits every bucket and the used map; writes the results into .grad.
  void finish_reduction(const at::Tensor& global_used);
  at::Tensor reduce_used_map();
  /// Note [Static graph]: the iteration that records the graph, and those that follow it.
  void finalize_recording_iteration();
  void check_static_graph_complete() const;
  [[noreturn]] void throw_graph_changed(size_t index) const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> locate_;  // param -> (bucket, position in bucket)
  ProcessGroupPtr group_;
  bool find_unused_;
  bool grad_as_view_;
  bool static_graph_;
  // Note [Static graph]: set by the first synchronised iteration.
  bool graph_recorded_ = false;
  std::vector<int> expected_hooks_;  // gradient-accumulator runs of each param per backward
  // Note [Reentrant backward]: the graph task whose end reduced this iteration.
  bool reduced_ = false;
  int reduced_task_ = -1;
  at::Tensor static_used_;  // the global used map of the first iteration
  CommHook hook_;
  int divisor_;

  std::vector<std::shared_ptr<torch::autograd::Node>> grad_accumulators_;
  std::vector<uintptr_t> hook_keys_;

  // Per-iteration state.
  bool expect_hooks_ = false;
  bool callback_queued_ = false;
  size_t next_bucket_ = 0;
  std::vector<bool> ready_;
  std::vector<int32_t> local_used_;  // 1 where this rank produced a gradient
  std::vector<int> hooks_seen_;      // gradient-accumulator runs this backward (static graph)
};

}  // namespace tdist::ddp::detail

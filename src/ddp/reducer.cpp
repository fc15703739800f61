#include "ddp/reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include "tdist/comm/distributed.h"
#include "tdist/comm/symmetric_memory.h"
#include "tdist/error.h"

namespace tdist::ddp::detail {

namespace {

/// Autograd post hook on a parameter's AccumulateGrad node: runs after .grad is final for
/// this backward. Holds the reducer weakly: a graph may outlive its DDP.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::weak_ptr<Reducer> reducer, size_t index)
      : reducer_(std::move(reducer)), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (auto reducer = reducer_.lock()) reducer->on_grad_ready(index_);
    return outputs;
  }

 private:
  std::weak_ptr<Reducer> reducer_;
  size_t index_;
};

// Note [Buckets in symmetric memory]: gradient buckets are allocated in symmetric memory
// (tdist/comm/symmetric_memory.h) when every rank of the group can have it, so that the
// Gloo engine's same-host all_reduce reads peers' buckets directly instead of staging them
// (about 2.5 instead of 4 bucket sizes of memory traffic per rank at world 2). The choice must
// be the same on every rank (a mix raises), hence one MIN all_reduce over the group's flags;
// anywhere the engine has no use for it (across hosts, MPI, TDIST_GLOO_SHM=0) a symmetric
// bucket is ordinary memory.
std::vector<at::Tensor> allocate_buckets(const std::vector<int64_t>& numels,
                                         const std::vector<at::TensorOptions>& options,
                                         const ProcessGroupPtr& group) {
  std::vector<at::Tensor> buffers;
  bool symmetric = symmetric_memory::is_available();
  for (const auto& o : options) symmetric = symmetric && o.device().is_cpu();
  if (symmetric) {
    try {
      for (size_t b = 0; b < numels.size(); ++b)
        buffers.push_back(symmetric_memory::empty({numels[b]}, options[b]));
    } catch (const DistBackendError&) {
      symmetric = false;  // /dev/shm full here: every rank falls back below
    }
  }
  at::Tensor everyone = to_collective_device(at::full({1}, symmetric ? 1 : 0, at::kInt), group);
  all_reduce(everyone, ReduceOp::MIN, group);
  if (everyone.item<int>() == 0) {
    buffers.clear();
    for (size_t b = 0; b < numels.size(); ++b)
      buffers.push_back(at::empty({numels[b]}, options[b]));
  }
  for (auto& b : buffers) b.zero_();
  return buffers;
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                 std::vector<std::vector<size_t>> bucket_indices, ProcessGroupPtr group,
                 bool find_unused_parameters, bool gradient_as_bucket_view, bool static_graph)
    : params_(std::move(params)),
      names_(std::move(names)),
      locate_(params_.size()),
      group_(std::move(group)),
      find_unused_(find_unused_parameters),
      grad_as_view_(gradient_as_bucket_view),
      static_graph_(static_graph),
      divisor_(group_->size()),
      ready_(params_.size(), false) {
  local_used_.assign(params_.size(), 0);
  hooks_seen_.assign(params_.size(), 0);
  std::vector<int64_t> numels;
  std::vector<at::TensorOptions> options;
  for (size_t b = 0; b < bucket_indices.size(); ++b) {
    Bucket bucket;
    bucket.params = bucket_indices[b];
    int64_t numel = 0;
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      locate_[bucket.params[k]] = {b, k};
      bucket.offsets.push_back(numel);
      numel += params_[bucket.params[k]].numel();
    }
    numels.push_back(numel);
    options.push_back(params_[bucket.params.front()].options().requires_grad(false));
    buckets_.push_back(std::move(bucket));
  }
  if (buckets_.empty()) return;
  auto buffers = allocate_buckets(numels, options, group_);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.buffer = buffers[b];
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const auto& p = params_[bucket.params[k]];
      // An alias made with set_() shares the bucket's storage without being an autograd
      // view, so LibTorch 1.13's Optimizer::zero_grad (which calls detach_() on every
      // gradient) also works on gradients that are bucket views.
      at::Tensor alias = at::empty({0}, bucket.buffer.options());
      alias.set_(bucket.buffer.storage(), bucket.buffer.storage_offset() + bucket.offsets[k],
                 p.sizes());
      bucket.views.push_back(alias);
    }
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < grad_accumulators_.size(); ++i) {
    grad_accumulators_[i]->del_post_hook(hook_keys_[i]);
  }
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> self = shared_from_this();
  for (size_t i = 0; i < params_.size(); ++i) {
    // Keeping the AccumulateGrad node alive keeps it the parameter's accumulator, so the
    // hook stays attached across iterations (as c10d's reducer does).
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
    TDIST_CHECK_ARG(accumulator != nullptr, "DDP: parameter '" + names_[i] +
                                                "' has no gradient accumulator; it must "
                                                "be a leaf tensor that requires grad");
    hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<GradReadyHook>(self, i)));
    grad_accumulators_.push_back(std::move(accumulator));
  }
}

void Reducer::set_comm_hook(CommHook hook) {
  TDIST_CHECK_ARG(!hook_, "DDP: register_comm_hook may only be called once");
  hook_ = std::move(hook);
}

void Reducer::prepare_for_backward() {
  expect_hooks_ = true;
  reduced_ = false;
  callback_queued_ = false;
  next_bucket_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(local_used_.begin(), local_used_.end(), 0);
  std::fill(hooks_seen_.begin(), hooks_seen_.end(), 0);
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    bucket.future.reset();
  }
  if (!static_graph_ || !graph_recorded_) return;
  // Note [Static graph]: parameters this rank's first backward never reached contribute
  // zeros, known before backward starts; their buckets launch with the next ready parameter.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (expected_hooks_[i] == 0) mark_ready_with_zeros(i);
  }
}

void Reducer::mark_ready_with_zeros(size_t index) {
  ready_[index] = true;
  auto [b, k] = locate_[index];
  buckets_[b].views[k].zero_();
  --buckets_[b].pending;
}

void Reducer::on_grad_ready(size_t index) {
  if (!expect_hooks_) {
    // Note [Reentrant backward]: a backward run inside another's node (reentrant activation
    // checkpointing) ends first, and the engine callback that reduces runs at its end; a
    // gradient the enclosing backward produces afterwards would be lost. Graph tasks are
    // numbered as they start, so one older than the task that reduced was running then.
    const int task = torch::autograd::get_current_graph_task_id();
    if (reduced_ && task >= 0 && task < reduced_task_) {
      TDIST_THROW(InvalidArgument,
                  "rank " + std::to_string(get_rank()) + ": DDP: parameter '" + names_[index] +
                      "' received a gradient after DDP reduced this iteration's: a backward "
                      "nested in another (reentrant activation checkpointing, or a custom "
                      "function calling backward) ended first; DDP does not support reentrant "
                      "backward: use non-reentrant checkpointing");
    }
    return;  // no_sync, or a backward without a DDP forward
  }
  if (!callback_queued_) {
    reduced_task_ = torch::autograd::get_current_graph_task_id();
    // Note [DDP finalize]: the engine runs this once the whole backward is done; there the
    // reducer launches what remains and waits, so backward() returns with averaged grads.
    callback_queued_ = true;
    std::weak_ptr<Reducer> self = shared_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([self] {
      if (auto reducer = self.lock()) reducer->finalize_backward();
    });
  }
  if (static_graph_) {
    // Note [Static graph]: the first backward only records (its gradients are reduced at
    // its end).
    ++hooks_seen_[index];
    if (!graph_recorded_) {
      local_used_[index] = 1;
      return;
    }
  }
  mark_ready(index);
}

void Reducer::mark_ready(size_t index) {
  if (ready_[index] && static_graph_) throw_graph_changed(index);
  if (ready_[index]) {
    TDIST_THROW(InvalidArgument,
                "rank " + std::to_string(get_rank()) + ": DDP: parameter '" + names_[index] +
                    "' received its gradient twice in one backward (backward run twice on "
                    "one forward, or reentrant backward); run one forward per backward");
  }
  ready_[index] = true;
  local_used_[index] = 1;
  auto [b, k] = locate_[index];
  Bucket& bucket = buckets_[b];
  const at::Tensor& grad = params_[index].grad();
  if (grad.defined()) {
    TDIST_CHECK_ARG(!grad.is_sparse(),
                    "DDP: sparse gradients are not supported (parameter '" + names_[index] + "')");
    // With gradient_as_bucket_view the gradient usually already lives in the bucket.
    if (!grad.is_same(bucket.views[k])) bucket.views[k].copy_(grad);
  } else {
    bucket.views[k].zero_();
  }
  if (--bucket.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  // Buckets launch strictly in order on every rank, so collectives match across ranks
  // even when a later bucket fills first.
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    launch(next_bucket_++);
  }
}

void Reducer::launch(size_t b) {
  Bucket& bucket = buckets_[b];
  std::vector<at::Tensor> params;
  for (auto i : bucket.params) params.push_back(params_[i]);
  GradBucket grad_bucket(b, b + 1 == buckets_.size(), bucket.buffer, bucket.views,
                         std::move(params), group_);
  bucket.future = hook_ ? hook_(grad_bucket) : allreduce_hook(grad_bucket);
}

at::Tensor Reducer::reduce_used_map() {
  at::Tensor used = to_collective_device(at::tensor(local_used_, at::kInt), group_);
  all_reduce(used, ReduceOp::SUM, group_);
  return used.cpu();
}

void Reducer::finalize_backward() {
  callback_queued_ = false;
  if (!expect_hooks_) return;
  expect_hooks_ = false;
  reduced_ = true;
  if (static_graph_ && !graph_recorded_) return finalize_recording_iteration();
  if (static_graph_) {
    check_static_graph_complete();
    launch_ready_buckets();
    return finish_reduction(static_used_);
  }
  at::Tensor global_used;
  if (find_unused_) {
    // Unused parameters contribute zeros; the used map decides below whose .grad to write.
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!ready_[i]) mark_ready_with_zeros(i);
    }
    launch_ready_buckets();
    global_used = reduce_used_map();
  } else if (next_bucket_ < buckets_.size()) {
    std::string missing;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!ready_[i]) missing += (missing.empty() ? "" : ", ") + names_[i];
    }
    TDIST_THROW(DistBackendError,
                "rank " + std::to_string(get_rank()) +
                    ": DDP: these parameters received no gradient in this backward: " + missing +
                    ". Either make every parameter take part in the loss, or construct DDP "
                    "with find_unused_parameters(true)");
  }
  finish_reduction(global_used);
}

// Note [Static graph]
// With static_graph(true) the first synchronised backward records which parameters got a
// gradient on this rank and, with one all-reduce, which ones some rank used; its gradients
// are reduced at its end, as with find_unused_parameters. Every later backward gives the
// parameters its first backward never reached zeros from the start and reuses the recorded
// used map: no all-reduce of its own. A backward whose graph differs is an error naming the
// parameter.
void Reducer::finalize_recording_iteration() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (local_used_[i]) {
      mark_ready(i);  // its .grad holds every pass's contribution by now
    } else {
      mark_ready_with_zeros(i);  // unused here: zeros, whatever .grad holds
    }
  }
  launch_ready_buckets();
  static_used_ = reduce_used_map();
  expected_hooks_ = hooks_seen_;
  graph_recorded_ = true;
  finish_reduction(static_used_);
}

void Reducer::check_static_graph_complete() const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) throw_graph_changed(i);
  }
}

void Reducer::throw_graph_changed(size_t index) const {
  TDIST_THROW(InvalidArgument,
              "rank " + std::to_string(get_rank()) + ": DDP: parameter '" + names_[index] +
                  "' received its gradient " + std::to_string(hooks_seen_[index]) +
                  " times in this backward, against " + std::to_string(expected_hooks_[index]) +
                  " in the first iteration; static_graph(true) needs the same graph every "
                  "iteration (use find_unused_parameters(true) instead)");
}

void Reducer::finish_reduction(const at::Tensor& global_used) {
  const double scale = static_cast<double>(group_->size()) / divisor_;
  std::vector<bool> used(params_.size(), true);
  if (global_used.defined()) {
    auto acc = global_used.accessor<int, 1>();
    for (size_t i = 0; i < params_.size(); ++i) used[i] = acc[static_cast<int64_t>(i)] != 0;
  }
  for (auto& bucket : buckets_) {
    at::Tensor result = bucket.future->wait(group_->timeout());
    bucket.future.reset();
    TDIST_CHECK_ARG(result.numel() == bucket.buffer.numel(),
                    "DDP: a communication hook returned " + std::to_string(result.numel()) +
                        " elements for a bucket of " + std::to_string(bucket.buffer.numel()));
    if (scale != 1.0) result = result.mul(scale);
    if (grad_as_view_ && !result.is_same(bucket.buffer)) {
      bucket.buffer.copy_(result);
      result = bucket.buffer;
    }
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const size_t i = bucket.params[k];
      if (!used[i]) continue;  // unused on every rank: leave .grad as it is, as PyTorch does
      at::Tensor& param = params_[i];
      at::Tensor slice = result.narrow(0, bucket.offsets[k], param.numel()).view(param.sizes());
      at::Tensor& grad = param.mutable_grad();
      if (grad_as_view_) {
        // Note [Gradient as bucket view]: .grad becomes a view of the bucket, so the next
        // backward accumulates straight into it and both copies disappear.
        if (!grad.is_same(bucket.views[k])) grad = bucket.views[k];
      } else if (grad.defined()) {
        grad.copy_(slice);
      } else {
        grad = slice.clone();
      }
    }
  }
}

void Reducer::shadow_backward() {
  prepare_for_backward();
  expect_hooks_ = false;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].buffer.zero_();
    launch(b);
  }
  at::Tensor global_used;
  if (static_graph_ && !graph_recorded_) {
    // The training ranks record the graph in this iteration; a joined rank takes their used
    // map and, having no graph of its own, expects no gradients afterwards.
    static_used_ = reduce_used_map();
    expected_hooks_ = hooks_seen_;
    graph_recorded_ = true;
    global_used = static_used_;
  } else if (static_graph_) {
    global_used = static_used_;
  } else if (find_unused_) {
    global_used = reduce_used_map();
  }
  finish_reduction(global_used);
}

}  // namespace tdist::ddp::detail

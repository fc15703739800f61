#include "tdist/ddp/distributed_data_parallel.h"

#include <sstream>

#include <ATen/ATen.h>

#include "ddp/reducer.h"
#include "tdist/comm/broadcast_coalesced.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/rank_agreement.h"
#include "tdist/detail/ddp/bucketing.h"
#include "tdist/error.h"

namespace tdist::ddp {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// The group gradients are averaged over: process_group's, the 1-D device_mesh's, or the world.
ProcessGroupPtr replica_group(const DistributedDataParallelOptions& options) {
  if (!options.device_mesh())
    return options.process_group() ? options.process_group() : group_world();
  TDIST_CHECK_ARG(options.process_group() == nullptr,
                  "DistributedDataParallel: give process_group or device_mesh, not both");
  const mesh::DeviceMesh& mesh = *options.device_mesh();
  TDIST_CHECK_ARG(mesh.ndim() == 1,
                  "DistributedDataParallel: device_mesh must be 1-D (it has " +
                      std::to_string(mesh.ndim()) +
                      " dimensions); pass the replicate dimension, e.g. mesh[\"dp\"]");
  return mesh.get_group();
}

}  // namespace

namespace detail {

/// Join hook of DDP: a joined rank shadows buffer broadcast and gradient reduction.
class DDPJoinHook : public join::JoinHook {
 public:
  explicit DDPJoinHook(DistributedDataParallelBase* ddp) : ddp_(ddp) {}
  void main_hook() override { ddp_->joined_iteration(); }
  void post_hook(bool is_last_joiner) override { ddp_->sync_final_model(is_last_joiner); }

 private:
  DistributedDataParallelBase* ddp_;
};

}  // namespace detail

detail::DistributedDataParallelBase::DistributedDataParallelBase(
    std::shared_ptr<torch::nn::Module> module, DistributedDataParallelOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  TDIST_CHECK_ARG(module_ != nullptr, "DistributedDataParallel: the module is null");
  TDIST_CHECK_ARG(options_.bucket_cap_mb() > 0 && options_.first_bucket_cap_mb() > 0,
                  "DistributedDataParallel: bucket_cap_mb and first_bucket_cap_mb must be > 0");
  group_ = replica_group(options_);
  TDIST_CHECK_ARG(group_->is_member(),
                  "DistributedDataParallel: this rank is not a member of the process group "
                  "given; construct DDP only on the group's ranks");
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    params_.push_back(item.value());
    param_names_.push_back(item.key());
  }
  buffers_ = module_->buffers(/*recurse=*/true);
  TDIST_CHECK_ARG(!params_.empty(), "rank " + std::to_string(get_rank()) +
                                        ": DistributedDataParallel: the module has no "
                                        "parameter that requires grad; there is nothing to "
                                        "synchronise");

  // Shapes are checked on every rank before the first collective that depends on them.
  verify_parameters_across_ranks();
  std::vector<at::Tensor> state = module_->parameters(/*recurse=*/true);
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  broadcast_coalesced(state, group_->global_rank(0), group_);

  // Note [DDP bucket order] (bucketing.h): fill buckets in reverse registration order.
  std::vector<at::Tensor> reversed(params_.rbegin(), params_.rend());
  const auto assignment = compute_bucket_assignment_by_size(
      reversed, {static_cast<int64_t>(options_.first_bucket_cap_mb() * kMiB),
                 static_cast<int64_t>(options_.bucket_cap_mb() * kMiB)});
  for (const auto& bucket : assignment) {
    std::vector<size_t> indices;
    for (auto j : bucket) indices.push_back(params_.size() - 1 - j);
    bucket_indices_.push_back(std::move(indices));
  }
  reducer_ = std::make_shared<detail::Reducer>(
      params_, param_names_, bucket_indices_, group_, options_.find_unused_parameters(),
      options_.gradient_as_bucket_view(), options_.static_graph());
  reducer_->install_hooks();
}

detail::DistributedDataParallelBase::~DistributedDataParallelBase() = default;

void detail::DistributedDataParallelBase::verify_parameters_across_ranks() const {
  std::vector<std::string> lines;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    std::ostringstream line;
    line << item.key() << " " << item.value().sizes() << " " << item.value().scalar_type()
         << (item.value().requires_grad() ? "" : " (frozen)");
    lines.push_back(line.str());
  }
  const auto d = find_disagreement(lines, group_);
  if (!d) return;
  TDIST_THROW(InvalidArgument,
              "rank " + std::to_string(get_rank()) +
                  ": DistributedDataParallel: the model differs across ranks: parameter #" +
                  std::to_string(d->line) + " is '" + d->value.value_or("(none)") + "' on rank " +
                  std::to_string(d->rank) + " but '" + d->reference_value.value_or("(none)") +
                  "' on rank " + std::to_string(d->reference_rank) +
                  "; every rank must construct the same model (same parameter names, shapes "
                  "and dtypes, in the same order)");
}

int detail::DistributedDataParallelBase::find_common_rank(bool active) const {
  at::Tensor rank =
      to_collective_device(at::full({1}, active ? group_->rank() : -1, at::kInt), group_);
  all_reduce(rank, ReduceOp::MAX, group_);
  return rank.item<int>();
}

int detail::DistributedDataParallelBase::global_grad_sync_count(bool wants_sync) const {
  at::Tensor flag = to_collective_device(at::full({1}, wants_sync ? 1 : 0, at::kInt), group_);
  all_reduce(flag, ReduceOp::SUM, group_);
  return flag.item<int>();
}

void detail::DistributedDataParallelBase::sync_buffers(int src) const {
  broadcast_coalesced(buffers_, src, group_);
}

void detail::DistributedDataParallelBase::pre_forward() {
  // Whether the next backward synchronises is decided here, at forward time (as PyTorch).
  const bool sync = at::GradMode::is_enabled() && require_backward_grad_sync_;
  if (sync) {
    reducer_->prepare_for_backward();
  } else {
    reducer_->expect_no_backward();
  }
  // Note [Join collective order]: a joined rank's DDPJoinHook::main_hook issues the same
  // collectives in the same order: (notify) -> common rank + buffers -> sync count ->
  // buckets -> used map.
  WorkPtr join_work = join::Join::notify_join_context(*this);
  const bool joining = join_config().enable;
  if (options_.broadcast_buffers() && !buffers_.empty()) {
    const int src = joining ? find_common_rank(true) : 0;
    sync_buffers(group_->global_rank(src));
  }
  if (joining) {
    const int count = global_grad_sync_count(sync);
    reducer_->set_divisor(divide_by_initial_world_size_ || count == 0 ? group_->size() : count);
  }
  if (join_work) join_work->wait(group_->timeout());
}

void detail::DistributedDataParallelBase::joined_iteration() {
  if (options_.broadcast_buffers() && !buffers_.empty()) {
    sync_buffers(group_->global_rank(find_common_rank(false)));
  }
  const int count = global_grad_sync_count(false);
  if (count == 0) return;  // the others run under no_sync (or without grad) this iteration
  reducer_->set_divisor(divide_by_initial_world_size_ ? group_->size() : count);
  reducer_->shadow_backward();
}

void detail::DistributedDataParallelBase::sync_final_model(bool is_last_joiner) {
  const int src = find_common_rank(is_last_joiner);
  std::vector<at::Tensor> state = module_->parameters(/*recurse=*/true);
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  broadcast_coalesced(state, group_->global_rank(src), group_);
  reducer_->set_divisor(group_->size());
}

void detail::DistributedDataParallelBase::register_comm_hook(CommHook hook) {
  TDIST_CHECK_ARG(static_cast<bool>(hook), "DistributedDataParallel: the comm hook is empty");
  reducer_->set_comm_hook(std::move(hook));
}

std::unique_ptr<join::JoinHook> detail::DistributedDataParallelBase::join_hook(
    const join::JoinKwargs& kwargs) {
  auto it = kwargs.find("divide_by_initial_world_size");
  divide_by_initial_world_size_ = it == kwargs.end() ? true : it->second.toBool();
  return std::make_unique<DDPJoinHook>(this);
}

c10::Device detail::DistributedDataParallelBase::join_device() const {
  return params_.front().device();
}

detail::DistributedDataParallelBase::NoSync::NoSync(DistributedDataParallelBase* ddp)
    : ddp_(ddp), previous_(ddp->require_backward_grad_sync_) {
  ddp_->require_backward_grad_sync_ = false;
}

detail::DistributedDataParallelBase::NoSync::NoSync(NoSync&& other) noexcept
    : ddp_(other.ddp_), previous_(other.previous_) {
  other.ddp_ = nullptr;
}

detail::DistributedDataParallelBase::NoSync::~NoSync() {
  if (ddp_) ddp_->require_backward_grad_sync_ = previous_;
}

}  // namespace tdist::ddp

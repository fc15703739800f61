#include "tdist/ddp/zero_redundancy_optimizer.h"

#include <algorithm>
#include <map>
#include <numeric>

#include <ATen/ATen.h>

#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::ddp {

namespace detail {

std::vector<std::vector<size_t>> partition_parameters(const std::vector<int64_t>& numels,
                                                      int world_size) {
  TDIST_CHECK_ARG(world_size > 0, "partition_parameters: world_size must be positive");
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return numels[a] > numels[b]; });
  std::vector<int64_t> load(world_size, 0);
  std::vector<std::vector<size_t>> parts(world_size);
  for (auto i : order) {
    const int rank = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    parts[rank].push_back(i);
    load[rank] += numels[i];
  }
  for (auto& p : parts) std::sort(p.begin(), p.end());
  return parts;
}

}  // namespace detail

/// Join hook of ZeroRedundancyOptimizer: a joined rank keeps its partition in step.
class ZeroJoinHook : public join::JoinHook {
 public:
  explicit ZeroJoinHook(ZeroRedundancyOptimizer* zero) : zero_(zero) {}
  // Not step(): a joined rank must not notify the join context again.
  void main_hook() override { zero_->step_local_and_sync(); }

 private:
  ZeroRedundancyOptimizer* zero_;
};

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> params,
                                                 const OptimizerFactory& factory,
                                                 ZeroRedundancyOptimizerOptions options)
    : params_(std::move(params)) {
  TDIST_CHECK_ARG(!params_.empty(), "ZeroRedundancyOptimizer: no parameters given");
  TDIST_CHECK_ARG(static_cast<bool>(factory), "ZeroRedundancyOptimizer: the factory is empty");
  group_ = options.process_group() ? options.process_group() : group_world();
  TDIST_CHECK_ARG(group_->is_member(),
                  "ZeroRedundancyOptimizer: this rank is not a member of the process group");
  std::vector<int64_t> numels;
  for (const auto& p : params_) numels.push_back(p.numel());
  partitions_ = detail::partition_parameters(numels, group_->size());
  owner_.assign(params_.size(), -1);
  for (int r = 0; r < group_->size(); ++r) {
    for (auto i : partitions_[r]) owner_[i] = r;
  }
  std::vector<at::Tensor> mine;
  for (auto i : partitions_[group_->rank()]) mine.push_back(params_[i]);
  if (!mine.empty()) local_ = factory(std::move(mine));
}

void ZeroRedundancyOptimizer::step() {
  join::Join::notify_join_context(*this);
  step_local_and_sync();
}

void ZeroRedundancyOptimizer::step_local_and_sync() {
  if (local_) local_->step();
  sync_params();
}

void ZeroRedundancyOptimizer::sync_params() {
  if (group_->size() == 1) return;
  at::NoGradGuard no_grad;
  struct Flat {
    std::vector<size_t> indices;
    at::Tensor tensor;
  };
  // One broadcast per (owner, dtype); all issued async, then unpacked in order.
  std::vector<Flat> flats;
  std::vector<WorkPtr> works;
  for (int r = 0; r < group_->size(); ++r) {
    std::map<at::ScalarType, std::vector<size_t>> by_dtype;
    for (auto i : partitions_[r]) by_dtype[params_[i].scalar_type()].push_back(i);
    for (auto& [dtype, indices] : by_dtype) {
      Flat flat;
      flat.indices = indices;
      if (r == group_->rank()) {
        std::vector<at::Tensor> parts;
        for (auto i : indices) parts.push_back(params_[i].detach().reshape({-1}));
        flat.tensor = at::cat(parts);
      } else {
        int64_t n = 0;
        for (auto i : indices) n += params_[i].numel();
        flat.tensor = at::empty({n}, params_[indices[0]].options().requires_grad(false));
      }
      works.push_back(broadcast(flat.tensor, group_->global_rank(r), group_, /*async_op=*/true));
      flats.push_back(std::move(flat));
    }
  }
  for (auto& w : works) w->wait(group_->timeout());
  for (size_t f = 0; f < flats.size(); ++f) {
    const int owner_rank = owner_[flats[f].indices.front()];
    if (owner_rank == group_->rank()) continue;
    int64_t offset = 0;
    for (auto i : flats[f].indices) {
      auto& p = params_[i];
      p.detach().copy_(flats[f].tensor.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  for (auto& p : params_) {
    at::Tensor& grad = p.mutable_grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      grad = at::Tensor();
    } else {
      grad = grad.detach();
      grad.zero_();
    }
  }
}

std::unique_ptr<join::JoinHook> ZeroRedundancyOptimizer::join_hook(
    const join::JoinKwargs& /*kwargs*/) {
  return std::make_unique<ZeroJoinHook>(this);
}

c10::Device ZeroRedundancyOptimizer::join_device() const {
  return params_.front().device();
}

}  // namespace tdist::ddp

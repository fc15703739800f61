#pragma once

// ZeroRedundancyOptimizer (torch.distributed.optim.ZeroRedundancyOptimizer), in namespace
// tdist::ddp: wraps any torch::optim optimizer so that each rank keeps optimizer state only
// for its partition of the parameters. step() updates the local partition, then every
// owner broadcasts its updated parameters (one coalesced broadcast per rank and dtype).
//
//   tdist::ddp::ZeroRedundancyOptimizer zero(
//       net->parameters(),
//       tdist::ddp::optimizer_factory<torch::optim::Adam>(torch::optim::AdamOptions(0.01)));
//   ...; loss.backward(); zero.step(); zero.zero_grad();

#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "tdist/arg.h"
#include "tdist/comm/process_group.h"
#include "tdist/join/join.h"

namespace tdist::ddp {

/// Builds the local optimizer over this rank's partition.
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor> params)>;

/// A factory for `OptimizerType(params, options)`, e.g. optimizer_factory<torch::optim::SGD>(
/// torch::optim::SGDOptions(0.1).momentum(0.9)).
template <typename OptimizerType, typename OptionsType>
OptimizerFactory optimizer_factory(OptionsType options) {
  return [options](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<OptimizerType>(std::move(params), options);
  };
}

struct ZeroRedundancyOptimizerOptions {
  /// The group the parameters are partitioned over; null: the world.
  TDIST_ARG(ProcessGroupPtr, process_group) = nullptr;
};

class ZeroRedundancyOptimizer : public join::Joinable {
 public:
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, const OptimizerFactory& factory,
                          ZeroRedundancyOptimizerOptions options = {});

  /// Steps the local partition, then broadcasts every partition from its owner.
  void step();
  /// Clears the gradients of *all* parameters (not only the local partition).
  void zero_grad(bool set_to_none = true);

  /// The optimizer over this rank's partition; null when the partition is empty.
  torch::optim::Optimizer* local_optimizer() { return local_.get(); }
  const std::vector<at::Tensor>& parameters() const { return params_; }
  /// Parameter indices per group rank.
  const std::vector<std::vector<size_t>>& partitions() const { return partitions_; }
  /// Group rank that owns (keeps the state of, and updates) parameter `index`.
  int owner(size_t index) const { return owner_[index]; }

  // Joinable: a joined rank keeps stepping (its partition, with the gradients its DDP join
  // hook received) and broadcasting, so the ranks still training get its parameters.
  std::unique_ptr<join::JoinHook> join_hook(const join::JoinKwargs& kwargs) override;
  c10::Device join_device() const override;
  ProcessGroupPtr join_process_group() const override { return group_; }

 private:
  friend class ZeroJoinHook;
  void step_local_and_sync();
  void sync_params();

  std::vector<at::Tensor> params_;
  ProcessGroupPtr group_;
  std::vector<std::vector<size_t>> partitions_;
  std::vector<int> owner_;
  std::unique_ptr<torch::optim::Optimizer> local_;
};

namespace detail {
/// Greedy partition by size: parameters largest first, each to the rank with the fewest
/// elements so far (lowest rank on ties). Returns indices per rank, each in increasing order.
std::vector<std::vector<size_t>> partition_parameters(const std::vector<int64_t>& numels,
                                                      int world_size);
}  // namespace detail

}  // namespace tdist::ddp

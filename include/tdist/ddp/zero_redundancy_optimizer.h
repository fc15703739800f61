#pragma once

// ZeroRedundancyOptimizer (torch.distributed.optim.ZeroRedundancyOptimizer), in namespace
// tdist::ddp: wraps any torch::optim optimizer so that each rank keeps optimizer state only
// for its partition of the parameters. step() updates the local partition, then every
// owner broadcasts its updated parameters.
//
//   tdist::ddp::ZeroRedundancyOptimizer zero(
//       net->parameters(),
//       tdist::ddp::optimizer_factory<torch::optim::Adam>(torch::optim::AdamOptions(0.01)));
//   ...; loss.backward(); zero.step(); zero.zero_grad();
//
// Saving and restoring (as PyTorch: every rank calls consolidate_state_dict, the rank it
// names reads state_dict(); every rank loads the whole state dict):
//
//   zero.consolidate_state_dict(/*to=*/0);
//   if (rank == 0) save(zero.state_dict());
//   ...
//   fresh_zero.load_state_dict(loaded);   // any world size

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

#include "tdist/arg.h"
#include "tdist/comm/process_group.h"
#include "tdist/detail/util/sharded_tensor.h"
#include "tdist/join/join.h"

namespace tdist::ddp {

/// Builds the local optimizer (PyTorch's `optimizer_class(param_groups, **defaults)`): one
/// group per ZeroRedundancyOptimizer param group, in order, each holding this rank's share
/// of that group's parameters (possibly none) and the group's options when it has its own.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<torch::optim::OptimizerParamGroup> param_groups)>;

/// A factory for `OptimizerType(param_groups, options)`, e.g. optimizer_factory<
/// torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9)).
template <typename OptimizerType, typename OptionsType>
OptimizerFactory optimizer_factory(OptionsType options) {
  return [options](std::vector<torch::optim::OptimizerParamGroup> param_groups)
             -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<OptimizerType>(param_groups, options);
  };
}

struct ZeroRedundancyOptimizerOptions {
  /// The group the parameters are partitioned over; null: the world.
  TDIST_ARG(ProcessGroupPtr, process_group) = nullptr;
  /// Each rank's parameters become views into one contiguous buffer per device and dtype
  /// (buckets()), and step() broadcasts each buffer whole: no packing or unpacking copies.
  TDIST_ARG(bool, parameters_as_bucket_view) = false;
  /// Not provided: true is refused (Note [ZeRO overlap_with_ddp] in the source).
  TDIST_ARG(bool, overlap_with_ddp) = false;
};

/// The whole optimizer's state in PyTorch's Optimizer.state_dict() layout ({"state": {index:
/// {field: value}}, "param_groups": [...]}) in tdist's types.
struct ZeroStateDict {
  /// "<index>.<field>" -> the whole tensor on the CPU, e.g. "3.exp_avg", "3.step" (a 0-dim
  /// int64); fields as util::optimizer_state_fields names them. The index is the parameter's
  /// position in the concatenation of the param groups' parameters (PyTorch's global index).
  /// Parameters without state yet (no step taken) have no entries.
  ShardedStateDict state;
  /// One object per param group: every option the group's LibTorch options serialize, under
  /// PyTorch's names (lr, betas, eps, weight_decay, amsgrad, momentum, ...), and "params",
  /// the global indices of the group's parameters.
  nlohmann::json param_groups = nlohmann::json::array();
};

/// One contiguous buffer of parameters_as_bucket_view: the parameters `rank` owns on one
/// device with one dtype; each of them is a view into `buffer`, in `indices` order.
struct ZeroParamBucket {
  int rank = 0;
  std::vector<size_t> indices;
  at::Tensor buffer;
};

class ZeroRedundancyOptimizer : public join::Joinable {
 public:
  /// One param group with the factory's options. Every rank must pass parameters of the
  /// same shapes and dtypes, in the same order (checked: InvalidArgument on every rank).
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, const OptimizerFactory& factory,
                          ZeroRedundancyOptimizerOptions options = {});
  /// Several param groups, each with its own options or (none set) the factory's.
  ZeroRedundancyOptimizer(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                          const OptimizerFactory& factory,
                          ZeroRedundancyOptimizerOptions options = {});

  /// Steps the local partition, then broadcasts every partition from its owner.
  void step();
  /// Clears the gradients of *all* parameters (not only the local partition).
  void zero_grad(bool set_to_none = true);

  /// Appends a param group (its options, or none for the factory's) on every rank: the
  /// parameters are re-partitioned as PyTorch does (the earlier ones keep their owners) and
  /// this rank's share of the new group becomes a new group of the local optimizer.
  /// Collective: every rank passes the same shapes (checked on every rank).
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);

  /// Gathers every rank's local optimizer state to group rank `to`, which keeps it for
  /// state_dict(). Collective: every rank calls it with the same `to`.
  void consolidate_state_dict(int to = 0);
  /// The whole optimizer's state, on the rank consolidate_state_dict last gathered to: the
  /// state as of that call, the param groups' options as they are now. InvalidArgument
  /// elsewhere and before consolidating (also after add_param_group / load_state_dict).
  ZeroStateDict state_dict() const;
  /// Loads a whole state dict (state_dict()'s, from a run at any world size) on every rank:
  /// each rank keeps the state of the parameters it owns, and every group's options (lr, ...)
  /// are set from it. The state dict must have this optimizer's param groups, of the same
  /// sizes, with state shaped like the parameters (InvalidArgument otherwise, before anything
  /// is changed). Parameters the state dict has no state for start afresh, as in PyTorch.
  void load_state_dict(const ZeroStateDict& state_dict);

  /// The optimizer over this rank's partition: one group per param group (possibly empty).
  /// Change an option (e.g. the lr) through it on every rank.
  torch::optim::Optimizer* local_optimizer() { return local_.get(); }
  /// Every parameter, in global index order (the param groups' parameters concatenated).
  const std::vector<at::Tensor>& parameters() const { return params_; }
  /// Global parameter indices per param group.
  const std::vector<std::vector<size_t>>& param_groups() const { return groups_; }
  /// Parameter indices per group rank, each in increasing order.
  const std::vector<std::vector<size_t>>& partitions() const { return partitions_; }
  /// Group rank that owns (keeps the state of, and updates) parameter `index`.
  int owner(size_t index) const { return owner_[index]; }
  /// parameters_as_bucket_view's buffers (empty without it), ordered by rank.
  const std::vector<ZeroParamBucket>& buckets() const { return buckets_; }

  // Joinable: a joined rank keeps stepping (its partition, with the gradients its DDP join
  // hook received) and broadcasting, so the ranks still training get its parameters.
  std::unique_ptr<join::JoinHook> join_hook(const join::JoinKwargs& kwargs) override;
  c10::Device join_device() const override;
  ProcessGroupPtr join_process_group() const override { return group_; }

 private:
  friend class ZeroJoinHook;
  void step_local_and_sync();
  void sync_params();
  void partition();
  void build_buckets();
  std::vector<torch::optim::OptimizerParamGroup> local_groups(
      const std::vector<torch::optim::OptimizerParamGroup>& groups) const;
  void check_new_parameters(const std::vector<at::Tensor>& params, const char* op) const;

  std::vector<at::Tensor> params_;
  std::vector<std::vector<size_t>> groups_;
  ProcessGroupPtr group_;
  bool bucket_view_ = false;
  std::vector<std::vector<size_t>> partitions_;
  std::vector<int> owner_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  std::vector<ZeroParamBucket> buckets_;
  /// consolidate_state_dict's result on the rank it gathered to.
  std::optional<ShardedStateDict> consolidated_;
};

namespace detail {
/// Greedy partition by size: parameters largest first, each to the rank with the fewest
/// elements so far (lowest rank on ties). Returns indices per rank, each in increasing order.
std::vector<std::vector<size_t>> partition_parameters(const std::vector<int64_t>& numels,
                                                      int world_size);
/// PyTorch's partition of several param groups: group by group, each group's parameters
/// largest first, each to the rank with the fewest elements so far over all groups. Indices
/// are global (the groups concatenated). Appending a group never moves an earlier parameter.
std::vector<std::vector<size_t>> partition_parameter_groups(
    const std::vector<std::vector<int64_t>>& numels_per_group, int world_size);
}  // namespace detail

}  // namespace tdist::ddp

#include "fsdp/group_builder.h"

#include <algorithm>

#include "fsdp/buffer_pool.h"
#include "fsdp/environment.h"
#include "tdist/detail/fsdp/shard_layout.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {

GroupBuilder::GroupBuilder(GroupPlan plan, c10::Device device)
    : plan_(std::move(plan)),
      device_(device),
      environment_(FSDPEnvironment::from_env()),
      world_(plan_.group->size()),
      rank_(plan_.group->rank()),
      params_(plan_.params.size()) {
  plan_.shard_dims.resize(plan_.params.size(), 0);
  for (size_t i = 0; i < plan_.params.size(); ++i) {
    offsets_.push_back(total_);
    total_ += ShardLayout::compute(plan_.params[i].second.sizes().vec(), world_, rank_,
                                   plan_.shard_dims[i])
                  .padded_shard_numel();
  }
}

// Note [Persistent buffers]: a plain CPU group gets its flat shard before the first
// parameter is sharded, so each shard is written once into it (no per-parameter shard
// allocated and freed, which fragments the heap of a large model).
void GroupBuilder::allocate_flat_shard_if_eligible() {
  flat_decided_ = true;
  const auto dtype = plan_.params.front().second.scalar_type();
  bool flat = device_.is_cpu() && total_ > 0 && !plan_.policy.offload_to_cpu &&
              !plan_.policy.compute_device &&
              (!plan_.policy.param_dtype || *plan_.policy.param_dtype == dtype) &&
              (!plan_.config.reduce_dtype || *plan_.config.reduce_dtype == dtype) &&
              environment_.persistent_buffers &&
              // Their grads and unsharded views are permuted; the memcpys assume dim 0.
              std::all_of(plan_.shard_dims.begin(), plan_.shard_dims.end(),
                          [](int64_t d) { return d == 0; });
  for (const auto& [name, tensor] : plan_.params) {
    flat = flat && tensor.scalar_type() == dtype && (tensor.is_cpu() || tensor.is_meta());
  }
  if (!flat) return;
  const size_t pooled_bytes = static_cast<size_t>(world_ * total_) * c10::elementSize(dtype);
  FlatShard shard = allocate_flat_shard(total_, pooled_bytes, at::TensorOptions().dtype(dtype),
                                        plan_.group, environment_.symmetric_buffers);
  plan_.config.flat_shard = shard.tensor;
  plan_.config.symmetric_buffers = shard.symmetric;
  plan_.config.placed_all_gather = environment_.placed_all_gather;
}

void GroupBuilder::shard(size_t i) {
  auto& [name, tensor] = plan_.params[i];
  TDIST_CHECK_ARG(!tensor.is_meta(),
                  "FSDP internal: sharding '" + name + "' while it is still on the meta device");
  params_[i] = std::make_unique<ShardedParam>(name, tensor, world_, rank_, plan_.policy,
                                              shard_buffer(i), plan_.shard_dims[i]);
}

void GroupBuilder::shard_in_place(size_t i, const ShardedParam::RowsFill& fill) {
  auto& [name, tensor] = plan_.params[i];
  params_[i] = std::make_unique<ShardedParam>(name, tensor, world_, rank_, plan_.policy,
                                              shard_buffer(i), device_, fill, plan_.shard_dims[i]);
}

at::Tensor GroupBuilder::shard_buffer(size_t i) {
  if (!flat_decided_) allocate_flat_shard_if_eligible();
  const at::Tensor& flat = plan_.config.flat_shard;
  if (!flat.defined()) return at::Tensor();
  const int64_t numel = (i + 1 < offsets_.size() ? offsets_[i + 1] : total_) - offsets_[i];
  return flat.narrow(0, offsets_[i], numel);
}

std::unique_ptr<ParamGroup> GroupBuilder::finish(const std::string& label) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i]) {
      TDIST_THROW(Error, "FSDP internal: parameter '" + plan_.params[i].first + "' of group '" +
                             label + "' was never sharded");
    }
  }
  return std::make_unique<ParamGroup>(label, std::move(params_), plan_.group,
                                      std::move(plan_.config));
}

}  // namespace tdist::fsdp::detail

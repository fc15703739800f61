// FullyShardedDataParallel::register_comm_hook: FSDP1's communication hook handed to every
// unit's ParamGroup as its reduce hook (Note [Reduce hook] in collectives.h).

#include <sstream>
#include <string>
#include <vector>

#include "fsdp/fsdp1/strategy.h"
#include "fsdp/fsdp_state.h"
#include "fsdp/param_group.h"
#include "tdist/error.h"
#include "tdist/fsdp/fully_sharded_data_parallel.h"

namespace tdist::fsdp::detail {

namespace {

// What a hook must leave as it found it: it writes into the tensor, it does not replace it.
struct TensorShape {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype;
  const void* data;

  explicit TensorShape(const at::Tensor& t)
      : sizes(t.sizes().vec()), dtype(t.scalar_type()), data(t.data_ptr()) {}
  bool operator==(const TensorShape& o) const {
    return sizes == o.sizes && dtype == o.dtype && data == o.data;
  }
  std::string str() const {
    std::ostringstream out;
    out << c10::IntArrayRef(sizes) << " " << dtype << " at " << data;
    return out.str();
  }
};

void check_unchanged(const at::Tensor& t, const TensorShape& before, const char* which,
                     const ParamGroup& group, const std::string& at) {
  const TensorShape after(t);
  if (after == before) return;
  TDIST_THROW(InvalidArgument, at + "the communication hook replaced " + which + " of unit '" +
                                   group.label() + "' (" + before.str() + " -> " + after.str() +
                                   "); write the result into it in place (div_, copy_, or a "
                                   "collective with it as output), keeping its shape and dtype");
}

// The core's reduce hook for one unit: sharded strategies hand the hook the flat input and
// this rank's output; NO_SHARD (a shard group of one) hands it the flat gradient to reduce in
// place, which is then this rank's output.
ReduceHook unit_reduce_hook(std::shared_ptr<CommHook> hook, bool sharded, const ParamGroup* group,
                            std::string at) {
  return [hook = std::move(hook), sharded, group, at = std::move(at)](const at::Tensor& input,
                                                                      const at::Tensor& output) {
    const TensorShape input_before(input), output_before(output);
    (*hook)(input, sharded ? output : at::Tensor());
    check_unchanged(input, input_before, "grad", *group, at);
    check_unchanged(output, output_before, "output", *group, at);
    if (!sharded) output.copy_(input);
  };
}

}  // namespace

void FullyShardedBase::register_comm_hook_impl(CommHook hook, bool takes_output, bool has_state) {
  const ShardingStrategy s = options_.sharding_strategy();
  const std::string at = where(s) + "register_comm_hook: ";
  if (!has_state) {
    TDIST_THROW(InvalidArgument,
                at + "the state is null; pass the hook's state, e.g. "
                     "std::make_shared<default_hooks::DefaultState>(tdist::group_world())");
  }
  if (s == ShardingStrategy::HYBRID_SHARD || s == ShardingStrategy::HYBRID_SHARD_ZERO2) {
    TDIST_THROW(InvalidArgument, at + "communication hooks are not supported for hybrid "
                                      "strategies (as in PyTorch); use FULL_SHARD, "
                                      "SHARD_GRAD_OP or NO_SHARD");
  }
  if (comm_hook_registered_) {
    TDIST_THROW(InvalidArgument, at + "a communication hook is already registered; register "
                                      "one hook, once");
  }
  FSDPState& root = state_of(root_);
  if (root.parent() != nullptr) {
    TDIST_THROW(InvalidArgument, at + "this model was later sharded inside another one; "
                                      "register the hook on the outermost "
                                      "FullyShardedDataParallel (the root)");
  }
  if (root.is_root()) {  // set by the first forward
    TDIST_THROW(InvalidArgument, at + "the model already ran a forward; register the hook "
                                      "before the first forward");
  }
  const bool sharded = s != ShardingStrategy::NO_SHARD;
  if (sharded && !takes_output) {
    TDIST_THROW(InvalidArgument,
                at + "hook(state, grad) reduces grad in place, for NO_SHARD; " + strategy_name(s) +
                    " needs hook(state, grad, output) that reduce-scatters into output "
                    "(default_hooks::reduce_scatter_hook, fp16_compress_hook, "
                    "bf16_compress_hook)");
  }
  auto shared = std::make_shared<CommHook>(std::move(hook));
  for (const FSDPModule& unit : fsdp_modules()) {
    ParamGroup* group = state_of(unit).group();
    if (group != nullptr) group->set_reduce_hook(unit_reduce_hook(shared, sharded, group, at));
  }
  comm_hook_registered_ = true;
}

}  // namespace tdist::fsdp::detail

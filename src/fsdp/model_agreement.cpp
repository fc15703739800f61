#include "fsdp/model_agreement.h"

#include <optional>
#include <sstream>

#include "fsdp/environment.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/rank_agreement.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {
namespace {

std::string dtype_or_own(const std::optional<c10::ScalarType>& dtype) {
  return dtype ? std::string(c10::toString(*dtype)) : "own";
}

// The options that choose which collectives run, with what sizes and dtypes.
std::string describe_options(const FullyShardOptions& options) {
  const MixedPrecisionPolicy& mp = options.mp_policy();
  const FSDPEnvironment env = FSDPEnvironment::from_env();
  std::ostringstream line;
  line << "options param_dtype=" << dtype_or_own(mp.param_dtype())
       << " reduce_dtype=" << dtype_or_own(mp.reduce_dtype())
       << " offload_to_cpu=" << options.offload_policy().offload_to_cpu()
       << " reshard_after_forward=" << options.reshard_after_forward().group_size()
       << " TDIST_FSDP_PERSISTENT_BUFFERS=" << env.persistent_buffers
       << " TDIST_FSDP_PLACED_ALL_GATHER=" << env.placed_all_gather;
  return line.str();
}

}  // namespace

std::vector<std::string> describe_fully_shard_call(
    const std::string& module_type, const std::vector<std::pair<std::string, at::Tensor>>& params,
    const std::vector<int64_t>& shard_dims, const FullyShardOptions& options) {
  std::vector<std::string> lines{"module " + module_type};
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, tensor] = params[i];
    std::ostringstream line;
    line << "parameter '" << name << "' " << tensor.sizes() << " " << tensor.scalar_type()
         << (tensor.requires_grad() ? "" : " frozen");
    if (i < shard_dims.size() && shard_dims[i] != 0) line << " sharded on dim " << shard_dims[i];
    lines.push_back(line.str());
  }
  lines.push_back(describe_options(options));
  return lines;
}

void verify_same_call_on_every_rank(const std::vector<std::string>& description,
                                    const std::vector<ProcessGroupPtr>& groups) {
  for (const auto& group : groups) {
    if (!group) continue;
    const auto d = find_disagreement(description, group);
    if (!d) continue;
    auto holds = [&](int rank, const std::optional<std::string>& line) {
      return "rank " + std::to_string(rank) + " has " +
             line.value_or("nothing at line #" + std::to_string(d->line));
    };
    TDIST_THROW(
        InvalidArgument,
        "rank " + std::to_string(get_rank()) + ": fully_shard (called on " + description.front() +
            " here): the ranks built different models or passed different options: " +
            holds(d->rank, d->value) + ", but " + holds(d->reference_rank, d->reference_value) +
            "; every rank must build the same model and call fully_shard on the same "
            "modules, in the same order, with the same options");
  }
}

}  // namespace tdist::fsdp::detail

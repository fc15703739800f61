#include "tdist/checkpoint/module_state.h"

#include <set>
#include <unordered_map>

#include <ATen/ATen.h>

#include "checkpoint/dtype.h"
#include "tdist/checkpoint/checkpoint_manager.h"
#include "tdist/checkpoint/optimizer_param_groups.h"
#include "tdist/ddp/distributed_data_parallel.h"
#include "tdist/detail/util/optimizer_state.h"
#include "tdist/error.h"
#include "tdist/fsdp/state_dict.h"

namespace tdist::checkpoint {

namespace {

ShardedStateDict with_prefix(const ShardedStateDict& state, const std::string& prefix) {
  ShardedStateDict out;
  for (const auto& [name, st] : state) out.emplace(prefix + name, st);
  return out;
}

/// Names of the parameters `optimizer` holds, as the module names them.
std::set<std::string> optimizer_param_names(const torch::nn::Module& module,
                                            torch::optim::Optimizer& optimizer) {
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : module.named_parameters(true)) {
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  std::set<std::string> out;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      auto it = names.find(p.unsafeGetTensorImpl());
      TDIST_CHECK_ARG(it != names.end(),
                      "checkpoint: the optimizer holds a parameter the module does not have; "
                      "pass the module the optimizer was built from");
      out.insert(it->second);
    }
  }
  return out;
}

/// Buffers to load the saved optimizer state of `optimizer`'s parameters into (keys without
/// the prefix), sliced like the parameters' slices in `model` so each rank reads only its
/// part; set_optimizer_state_dict then installs them.
ShardedStateDict optimizer_targets(const torch::nn::Module& module,
                                   torch::optim::Optimizer& optimizer,
                                   const ShardedStateDict& model,
                                   const CheckpointMetadata& metadata) {
  const std::set<std::string> params = optimizer_param_names(module, optimizer);
  const std::string prefix = kOptimPrefix;
  ShardedStateDict out;
  for (const auto& [key, info] : metadata.tensors) {
    if (key.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = key.substr(prefix.size());
    const auto dot = rest.rfind('.');
    if (dot == std::string::npos) continue;
    const std::string fqn = rest.substr(0, dot);
    const std::string field = rest.substr(dot + 1);
    if (params.count(fqn) == 0) continue;  // reported as unexpected by load()
    const auto dtype = detail::dtype_from_name(info.dtype, "'" + key + "'");
    auto slot = model.find(fqn);
    if (field != "step" && slot != model.end() && slot->second.global_shape == info.global_shape) {
      const ShardedTensor& s = slot->second;
      out[rest] = ShardedTensor{at::empty(s.local.sizes(), s.local.options().dtype(dtype)),
                                s.global_shape, s.offsets};
    } else {
      // step counters; or a shape the parameter does not have, which loads whole and then
      // fails in set_optimizer_state_dict naming the key.
      out[rest] = ShardedTensor::whole(at::empty(info.global_shape, at::TensorOptions(dtype)));
    }
  }
  return out;
}

/// `extra` with the optimizer's param groups, as save_module stores them.
ExtraState with_param_groups(const ExtraState& extra, const torch::nn::Module& module,
                             const torch::optim::Optimizer* optimizer) {
  ExtraState out = extra;
  if (optimizer != nullptr) out.optimizer_param_groups = optimizer_param_groups(module, *optimizer);
  return out;
}

/// The param groups a checkpoint saved (every rank saves the same), or null.
nlohmann::json saved_param_groups(const CheckpointMetadata& metadata) {
  for (const ExtraState& e : metadata.extra_per_rank) {
    if (!e.optimizer_param_groups.is_null()) return e.optimizer_param_groups;
  }
  return nullptr;
}

}  // namespace

ShardedStateDict module_state_dict(const torch::nn::Module& module, const std::string& prefix) {
  return with_prefix(fsdp::get_model_state_dict(module), prefix);
}

ShardedStateDict optimizer_state_dict(const torch::nn::Module& module,
                                      torch::optim::Optimizer& optimizer,
                                      const std::string& prefix) {
  return with_prefix(fsdp::get_optimizer_state_dict(module, optimizer), prefix);
}

namespace detail {

OptimizerStateView optimizer_state_view(torch::optim::Optimizer& optimizer,
                                        const torch::nn::Module& module, bool create,
                                        const std::map<std::string, TensorInfo>* wanted) {
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : module.named_parameters(true)) {
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  OptimizerStateView view;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      auto it = names.find(p.unsafeGetTensorImpl());
      TDIST_CHECK_ARG(it != names.end(),
                      "checkpoint: the optimizer holds a parameter the module does not have; "
                      "pass the module the optimizer was built from");
      const std::string prefix = std::string(kOptimPrefix) + it->second + ".";
      std::set<std::string> saved;
      if (create && wanted != nullptr) {
        for (auto w = wanted->lower_bound(prefix);
             w != wanted->end() && w->first.compare(0, prefix.size(), prefix) == 0; ++w) {
          const std::string field = w->first.substr(prefix.size());
          if (field.find('.') == std::string::npos) saved.insert(field);
        }
      }
      for (auto& f : util::optimizer_state_fields(optimizer, p, p.detach(), saved)) {
        view.tensors[prefix + f.name] = ShardedTensor::whole(f.tensor);
        if (f.is_step) {
          view.apply_scalars.push_back(
              [t = f.tensor, set = f.set_step] { set(t.item<int64_t>()); });
        }
      }
    }
  }
  return view;
}

}  // namespace detail

void save_module(const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                 const ExtraState& extra, const std::string& dir, const SaveOptions& options) {
  ShardedStateDict state = module_state_dict(module);
  if (optimizer != nullptr) {
    ShardedStateDict optim = optimizer_state_dict(module, *optimizer);
    state.insert(optim.begin(), optim.end());
  }
  save(state, with_param_groups(extra, module, optimizer), dir, options);
}

LoadResult load_module(torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                       const std::string& dir, const LoadOptions& options) {
  fsdp::detail::prepare_to_load(module);
  const ShardedStateDict model = fsdp::get_model_state_dict(module);  // aliases: loads in place
  ShardedStateDict state = with_prefix(model, kModelPrefix);
  ShardedStateDict optim;
  nlohmann::json param_groups;
  if (optimizer != nullptr) {
    CheckpointMetadata metadata;
    bool have_metadata = true;
    try {
      metadata = read_metadata(dir);
    } catch (const CheckpointError&) {
      have_metadata = false;  // load() below reports it, on every rank at once
    }
    if (have_metadata) {
      param_groups = saved_param_groups(metadata);
      // Refused before any byte is read: every rank sees the same metadata and groups.
      if (param_groups.is_array() && param_groups.size() != optimizer->param_groups().size()) {
        TDIST_THROW(InvalidArgument,
                    "load_module: the checkpoint '" + dir + "' has " +
                        std::to_string(param_groups.size()) +
                        " optimizer param groups, the "
                        "optimizer " +
                        std::to_string(optimizer->param_groups().size()) +
                        "; build the optimizer with the same param groups as the run that "
                        "saved it");
      }
      optim = optimizer_targets(module, *optimizer, model, metadata);
    }
    for (const auto& [name, st] : optim) state.emplace(kOptimPrefix + name, st);
  }
  LoadResult result = load(state, dir, options);
  if (optimizer != nullptr && !optim.empty()) {
    fsdp::set_optimizer_state_dict(module, *optimizer, optim,
                                   fsdp::StateDictOptions().strict(false));
  }
  if (optimizer != nullptr && !param_groups.is_null()) {
    set_optimizer_param_groups(module, *optimizer, param_groups);
  }
  return result;
}

void save_module(const ddp::detail::DistributedDataParallelBase& ddp,
                 torch::optim::Optimizer* optimizer, const ExtraState& extra,
                 const std::string& dir, const SaveOptions& options) {
  TDIST_CHECK_ARG(ddp.module_base() != nullptr, "save_module: the DDP wrapper holds no module");
  save_module(*ddp.module_base(), optimizer, extra, dir, options);
}

LoadResult load_module(ddp::detail::DistributedDataParallelBase& ddp,
                       torch::optim::Optimizer* optimizer, const std::string& dir,
                       const LoadOptions& options) {
  TDIST_CHECK_ARG(ddp.module_base() != nullptr, "load_module: the DDP wrapper holds no module");
  return load_module(*ddp.module_base(), optimizer, dir, options);
}

std::string save_module(CheckpointManager& manager, int64_t step, const torch::nn::Module& module,
                        torch::optim::Optimizer* optimizer, const ExtraState& extra) {
  ShardedStateDict state = module_state_dict(module);
  if (optimizer != nullptr) {
    ShardedStateDict optim = optimizer_state_dict(module, *optimizer);
    state.insert(optim.begin(), optim.end());
  }
  return manager.save(step, state, with_param_groups(extra, module, optimizer));
}

std::optional<LoadResult> load_latest_module(CheckpointManager& manager, torch::nn::Module& module,
                                             torch::optim::Optimizer* optimizer,
                                             const LoadOptions& options) {
  return manager.load_latest(
      [&](const std::string& dir, const LoadOptions& o) {
        return load_module(module, optimizer, dir, o);
      },
      options);
}

}  // namespace tdist::checkpoint

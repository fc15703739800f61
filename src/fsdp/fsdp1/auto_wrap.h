#pragma once

// Auto-wrap planning for the FSDP1 surface: which submodules get their own fully_shard,
// decided by an AutoWrapPolicy exactly as Python's _recursive_wrap does.

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "tdist/fsdp/fully_sharded_data_parallel.h"

namespace tdist::fsdp::detail {

struct WrapTarget {
  std::string name;  // as named_modules() of the root gives it
  std::shared_ptr<torch::nn::Module> module;
};

/// The submodules of `root` (never the root itself) the policy wraps, bottom-up (children
/// before parents), so applying fully_shard in this order nests correctly. Ignored modules
/// are neither descended into nor wrapped; ignored parameters are never counted; modules
/// already fully_shard'ed count as wrapped and are not descended into.
std::vector<WrapTarget> plan_auto_wrap(
    const std::shared_ptr<torch::nn::Module>& root, const AutoWrapPolicy& policy,
    const std::unordered_set<const torch::nn::Module*>& ignored_modules,
    const std::unordered_set<const c10::TensorImpl*>& ignored_params);

}  // namespace tdist::fsdp::detail

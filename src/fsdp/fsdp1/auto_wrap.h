#pragma once

// Auto-wrap planning for the FSDP1 surface: which submodules get their own fully_shard,
// decided by an AutoWrapPolicy exactly as Python's _recursive_wrap does, or by a CustomPolicy
// as Python's _run_policy and _post_order_apply do.

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
  FSDPUnitOptions overrides;  // a CustomPolicy's, over the root's options (empty: none)
};

/// The submodules of `root` (never the root itself) the policy wraps, bottom-up (children
/// before parents), so applying fully_shard in this order nests correctly. Ignored modules
/// are neither descended into nor wrapped; ignored parameters are never counted; modules
/// already fully_shard'ed count as wrapped and are not descended into.
std::vector<WrapTarget> plan_auto_wrap(
    const std::shared_ptr<torch::nn::Module>& root, const AutoWrapPolicy& policy,
    const std::unordered_set<const torch::nn::Module*>& ignored_modules,
    const std::unordered_set<const c10::TensorImpl*>& ignored_params);

/// The submodules a CustomPolicy wraps, bottom-up, each with its overrides: every module of
/// the tree is asked once (a module reachable twice is visited once, under its first name);
/// the root's answer is not used; ignored modules are not asked; modules already
/// fully_shard'ed are neither asked nor descended into.
std::vector<WrapTarget> plan_custom_wrap(
    const std::shared_ptr<torch::nn::Module>& root, const CustomPolicy& policy,
    const std::unordered_set<const torch::nn::Module*>& ignored_modules);

}  // namespace tdist::fsdp::detail

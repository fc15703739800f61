#include "fsdp/fsdp1/auto_wrap.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>

#include "tdist/error.h"

namespace tdist::fsdp {

AutoWrapPolicy module_wrap_policy(ModulePredicate is_wrap_module) {
  TDIST_CHECK_ARG(static_cast<bool>(is_wrap_module),
                  "module_wrap_policy: the predicate is empty; pass a function or use "
                  "module_type_wrap_policy<Impl>()");
  return [is_wrap_module = std::move(is_wrap_module)](const torch::nn::Module& m, bool recurse,
                                                      int64_t) {
    return recurse || is_wrap_module(m);
  };
}

AutoWrapPolicy lambda_auto_wrap_policy(ModulePredicate fn) {
  return module_wrap_policy(std::move(fn));
}

AutoWrapPolicy always_wrap_policy() {
  return [](const torch::nn::Module&, bool, int64_t) { return true; };
}

AutoWrapPolicy size_based_auto_wrap_policy(int64_t min_num_params,
                                           ModulePredicate force_leaf_modules,
                                           ModulePredicate exclude_wrap_modules) {
  TDIST_CHECK_ARG(min_num_params >= 0, "size_based_auto_wrap_policy: min_num_params is " +
                                           std::to_string(min_num_params) + "; it must be >= 0");
  if (!force_leaf_modules) {
    force_leaf_modules = [](const torch::nn::Module& m) {
      return dynamic_cast<const torch::nn::MultiheadAttentionImpl*>(&m) != nullptr;
    };
  }
  if (!exclude_wrap_modules) {
    exclude_wrap_modules = [](const torch::nn::Module& m) {
      return dynamic_cast<const torch::nn::ModuleListImpl*>(&m) != nullptr ||
             dynamic_cast<const torch::nn::ModuleDictImpl*>(&m) != nullptr;
    };
  }
  return [=](const torch::nn::Module& m, bool recurse, int64_t nonwrapped_numel) {
    const bool is_large = nonwrapped_numel >= min_num_params;
    if (recurse) return is_large && !force_leaf_modules(m);
    return is_large && !exclude_wrap_modules(m);
  };
}

namespace detail {

namespace {

class Planner {
 public:
  Planner(const AutoWrapPolicy& policy,
          const std::unordered_set<const torch::nn::Module*>& ignored_modules,
          const std::unordered_set<const c10::TensorImpl*>& ignored_params)
      : policy_(policy), ignored_modules_(ignored_modules), ignored_params_(ignored_params) {}

  // Returns the number of parameters of `module` that ended up in a wrapped unit (itself or
  // descendants), as Python's _recursive_wrap.
  int64_t visit(const std::shared_ptr<torch::nn::Module>& module, const std::string& name,
                bool only_children) {
    const int64_t nonwrapped = numel_of(*module);
    if (!only_children && is_fully_sharded(*module)) return nonwrapped;  // wrapped already
    if (!policy_(*module, /*recurse=*/true, nonwrapped)) return 0;
    int64_t wrapped = 0;
    for (const auto& child : module->named_children()) {
      if (ignored_modules_.count(child.value().get()) != 0) continue;
      wrapped += visit(child.value(), name.empty() ? child.key() : name + "." + child.key(),
                       /*only_children=*/false);
    }
    if (!only_children && policy_(*module, /*recurse=*/false, nonwrapped - wrapped)) {
      targets_.push_back({name, module, FSDPUnitOptions()});
      return nonwrapped;
    }
    return wrapped;
  }

  std::vector<WrapTarget> take() { return std::move(targets_); }

 private:
  // Distinct, non-ignored parameters (a parameter shared by two submodules counts once).
  int64_t numel_of(const torch::nn::Module& module) const {
    std::unordered_set<const c10::TensorImpl*> seen;
    int64_t total = 0;
    for (const auto& p : module.parameters(/*recurse=*/true)) {
      const c10::TensorImpl* impl = p.unsafeGetTensorImpl();
      if (ignored_params_.count(impl) != 0 || !seen.insert(impl).second) continue;
      total += p.numel();
    }
    return total;
  }

  const AutoWrapPolicy& policy_;
  const std::unordered_set<const torch::nn::Module*>& ignored_modules_;
  const std::unordered_set<const c10::TensorImpl*>& ignored_params_;
  std::vector<WrapTarget> targets_;
};

}  // namespace

namespace {

void visit_post_order(const std::shared_ptr<torch::nn::Module>& module, const std::string& name,
                      const CustomPolicy& policy,
                      const std::unordered_set<const torch::nn::Module*>& ignored_modules,
                      std::unordered_set<const torch::nn::Module*>& visited,
                      std::vector<WrapTarget>& out) {
  for (const auto& child : module->named_children()) {
    const torch::nn::Module* m = child.value().get();
    if (ignored_modules.count(m) != 0 || is_fully_sharded(*m) || !visited.insert(m).second) {
      continue;
    }
    visit_post_order(child.value(), name.empty() ? child.key() : name + "." + child.key(), policy,
                     ignored_modules, visited, out);
  }
  if (name.empty()) return;  // the root: the caller shards it with the FSDPOptions
  const CustomWrap answer = policy.fn()(*module);
  if (answer.wrap()) out.push_back({name, module, answer.overrides()});
}

}  // namespace

std::vector<WrapTarget> plan_custom_wrap(
    const std::shared_ptr<torch::nn::Module>& root, const CustomPolicy& policy,
    const std::unordered_set<const torch::nn::Module*>& ignored_modules) {
  TDIST_CHECK_ARG(static_cast<bool>(policy.fn()),
                  "CustomPolicy: the function is empty; pass one returning false, true or "
                  "FSDPUnitOptions for a module");
  std::unordered_set<const torch::nn::Module*> visited{root.get()};
  std::vector<WrapTarget> out;
  visit_post_order(root, "", policy, ignored_modules, visited, out);
  return out;
}

std::vector<WrapTarget> plan_auto_wrap(
    const std::shared_ptr<torch::nn::Module>& root, const AutoWrapPolicy& policy,
    const std::unordered_set<const torch::nn::Module*>& ignored_modules,
    const std::unordered_set<const c10::TensorImpl*>& ignored_params) {
  if (!policy) return {};
  Planner planner(policy, ignored_modules, ignored_params);
  planner.visit(root, "", /*only_children=*/true);
  return planner.take();
}

}  // namespace detail
}  // namespace tdist::fsdp

#include "fsdp/registry.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "fsdp/fsdp_state.h"
#include "tdist/error.h"

namespace tdist::fsdp::detail {

namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<const torch::nn::Module*, std::shared_ptr<FSDPState>> states;
};

Registry& registry() {
  static Registry* r = new Registry();  // leaked: states may outlive static destruction
  return *r;
}

// Drops states whose module is gone (a new module may reuse the address).
void prune_locked(Registry& r) {
  for (auto it = r.states.begin(); it != r.states.end();) {
    if (it->second->module().expired()) {
      it = r.states.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

FSDPState* find_state(const torch::nn::Module& module) {
  return find_state_ptr(module).get();
}

std::shared_ptr<FSDPState> find_state_ptr(const torch::nn::Module& module) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.states.find(&module);
  if (it == r.states.end() || it->second->module().expired()) return nullptr;
  return it->second;
}

void register_state(const torch::nn::Module& module, std::shared_ptr<FSDPState> state) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  prune_locked(r);
  auto [it, inserted] = r.states.emplace(&module, std::move(state));
  if (!inserted) {
    TDIST_THROW(InvalidArgument, "fully_shard: module '" + module.name() +
                                     "' is already sharded; apply fully_shard once per module");
  }
}

std::vector<FSDPState*> states_under(const torch::nn::Module& module) {
  std::vector<FSDPState*> out;
  auto add = [&](FSDPState* s) {  // once: modules sharded together share one state
    if (s != nullptr && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  };
  add(find_state(module));
  for (const auto& m : module.modules(/*include_self=*/false)) add(find_state(*m));
  return out;
}

}  // namespace tdist::fsdp::detail

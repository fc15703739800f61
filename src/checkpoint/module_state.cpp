#include "tdist/checkpoint/module_state.h"

#include <torch/optim.h>

#include "checkpoint/optimizer_compat.h"
#include "tdist/error.h"

namespace tdist::checkpoint {

ShardedStateDict module_state_dict(const torch::nn::Module& module, const std::string& prefix) {
  ShardedStateDict out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out[prefix + item.key()] = ShardedTensor::whole(item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    out[prefix + item.key()] = ShardedTensor::whole(item.value());
  }
  return out;
}

namespace detail {
namespace {

/// Exposes one optimizer's per-parameter state fields for one parameter.
class StateFields {
 public:
  StateFields(OptimizerStateView* view, std::string prefix, const at::Tensor& param, bool create,
              const std::map<std::string, TensorInfo>* wanted)
      : view_(view), prefix_(std::move(prefix)), param_(param), create_(create), wanted_(wanted) {}

  /// A tensor field: exposed if defined; created (zeros) when loading and it was saved.
  template <typename State, typename Get, typename Set>
  void tensor(State& st, const std::string& key, Get get, Set set) {
    at::Tensor t = get(st);
    if (!t.defined() && create_ && saved(key)) {
      t = at::zeros_like(param_, at::MemoryFormat::Contiguous);
      set(st, t);
    }
    if (t.defined()) view_->tensors[prefix_ + key] = ShardedTensor::whole(t);
  }

  /// An int64 field, moved through a 0-dim tensor.
  template <typename State, typename Get, typename Set>
  void scalar(State& st, const std::string& key, Get get, Set set) {
    at::Tensor t = at::scalar_tensor(static_cast<int64_t>(get(st)), at::kLong);
    view_->tensors[prefix_ + key] = ShardedTensor::whole(t);
    State* target = &st;
    view_->apply_scalars.push_back([t, target, set] { set(*target, t.item<int64_t>()); });
  }

  bool saved(const std::string& key) const {
    return wanted_ != nullptr && wanted_->count(prefix_ + key) > 0;
  }
  bool any_saved() const {
    if (wanted_ == nullptr) return false;
    auto it = wanted_->lower_bound(prefix_);
    return it != wanted_->end() && it->first.compare(0, prefix_.size(), prefix_) == 0;
  }

 private:
  OptimizerStateView* view_;
  std::string prefix_;
  at::Tensor param_;
  bool create_;
  const std::map<std::string, TensorInfo>* wanted_;
};

template <typename State>
State* find_or_create(torch::optim::Optimizer& optimizer, const at::Tensor& param, bool create) {
  auto& states = optimizer.state();
  const auto key = optimizer_state_key(optimizer, param);
  auto it = states.find(key);
  if (it == states.end()) {
    if (!create) return nullptr;
    it = states.emplace(key, std::make_unique<State>()).first;
  }
  auto* st = dynamic_cast<State*>(it->second.get());
  TDIST_CHECK_ARG(st != nullptr, "checkpoint: optimizer state has an unexpected type");
  return st;
}

template <typename Options>
void adam_like(torch::optim::Optimizer& opt, const at::Tensor& p, StateFields& f, bool create) {
  using State = std::conditional_t<std::is_same_v<Options, torch::optim::AdamOptions>,
                                   torch::optim::AdamParamState, torch::optim::AdamWParamState>;
  auto* st = find_or_create<State>(opt, p, create && f.any_saved());
  if (st == nullptr) return;
  f.scalar(
      *st, "step", [](State& s) { return s.step(); }, [](State& s, int64_t v) { s.step(v); });
  f.tensor(
      *st, "exp_avg", [](State& s) { return s.exp_avg(); },
      [](State& s, const at::Tensor& t) { s.exp_avg(t); });
  f.tensor(
      *st, "exp_avg_sq", [](State& s) { return s.exp_avg_sq(); },
      [](State& s, const at::Tensor& t) { s.exp_avg_sq(t); });
  f.tensor(
      *st, "max_exp_avg_sq", [](State& s) { return s.max_exp_avg_sq(); },
      [](State& s, const at::Tensor& t) { s.max_exp_avg_sq(t); });
}

void fields_for(torch::optim::Optimizer& opt, const at::Tensor& p, StateFields& f, bool create) {
  namespace o = torch::optim;
  if (dynamic_cast<o::Adam*>(&opt) != nullptr) {
    adam_like<o::AdamOptions>(opt, p, f, create);
  } else if (dynamic_cast<o::AdamW*>(&opt) != nullptr) {
    adam_like<o::AdamWOptions>(opt, p, f, create);
  } else if (dynamic_cast<o::SGD*>(&opt) != nullptr) {
    auto* st = find_or_create<o::SGDParamState>(opt, p, create && f.any_saved());
    if (st == nullptr) return;
    f.tensor(
        *st, "momentum_buffer", [](o::SGDParamState& s) { return s.momentum_buffer(); },
        [](o::SGDParamState& s, const at::Tensor& t) { s.momentum_buffer(t); });
  } else if (dynamic_cast<o::Adagrad*>(&opt) != nullptr) {
    // Adagrad creates its state eagerly, so it is always there.
    auto* st = find_or_create<o::AdagradParamState>(opt, p, create && f.any_saved());
    if (st == nullptr) return;
    f.scalar(
        *st, "step", [](o::AdagradParamState& s) { return s.step(); },
        [](o::AdagradParamState& s, int64_t v) { s.step(v); });
    f.tensor(
        *st, "sum", [](o::AdagradParamState& s) { return s.sum(); },
        [](o::AdagradParamState& s, const at::Tensor& t) { s.sum(t); });
  } else if (dynamic_cast<o::RMSprop*>(&opt) != nullptr) {
    using S = o::RMSpropParamState;
    auto* st = find_or_create<S>(opt, p, create && f.any_saved());
    if (st == nullptr) return;
    f.scalar(
        *st, "step", [](S& s) { return s.step(); }, [](S& s, int64_t v) { s.step(v); });
    f.tensor(
        *st, "square_avg", [](S& s) { return s.square_avg(); },
        [](S& s, const at::Tensor& t) { s.square_avg(t); });
    f.tensor(
        *st, "momentum_buffer", [](S& s) { return s.momentum_buffer(); },
        [](S& s, const at::Tensor& t) { s.momentum_buffer(t); });
    f.tensor(
        *st, "grad_avg", [](S& s) { return s.grad_avg(); },
        [](S& s, const at::Tensor& t) { s.grad_avg(t); });
  } else {
    TDIST_THROW(InvalidArgument,
                "checkpoint: optimizer type not supported by the module adapter (Adam, AdamW, "
                "SGD, Adagrad, RMSprop are); save its state as a ShardedStateDict yourself");
  }
}

}  // namespace

OptimizerStateView optimizer_state_view(torch::optim::Optimizer& optimizer,
                                        const torch::nn::Module& module, bool create,
                                        const std::map<std::string, TensorInfo>* wanted) {
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : module.named_parameters(true)) {
    names[item.value().unsafeGetTensorImpl()] = item.key();
  }
  OptimizerStateView view;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      auto it = names.find(p.unsafeGetTensorImpl());
      TDIST_CHECK_ARG(it != names.end(),
                      "checkpoint: the optimizer holds a parameter the module does not have; "
                      "pass the module the optimizer was built from");
      StateFields fields(&view, std::string(kOptimPrefix) + it->second + ".", p, create, wanted);
      fields_for(optimizer, p, fields, create);
    }
  }
  return view;
}

}  // namespace detail

void save_module(const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                 const ExtraState& extra, const std::string& dir, const SaveOptions& options) {
  ShardedStateDict state = module_state_dict(module);
  if (optimizer != nullptr) {
    auto view = detail::optimizer_state_view(*optimizer, module, false, nullptr);
    state.insert(view.tensors.begin(), view.tensors.end());
  }
  save(state, extra, dir, options);
}

LoadResult load_module(torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                       const std::string& dir, const LoadOptions& options) {
  ShardedStateDict state = module_state_dict(module);
  detail::OptimizerStateView view;
  if (optimizer != nullptr) {
    CheckpointMetadata metadata;
    bool have_metadata = true;
    try {
      metadata = read_metadata(dir);
    } catch (const CheckpointError&) {
      have_metadata = false;  // load() below reports it, on every rank at once
    }
    view = detail::optimizer_state_view(*optimizer, module, have_metadata,
                                        have_metadata ? &metadata.tensors : nullptr);
    state.insert(view.tensors.begin(), view.tensors.end());
  }
  LoadResult result = load(state, dir, options);
  for (auto& apply : view.apply_scalars) apply();
  return result;
}

}  // namespace tdist::checkpoint

#include "tdist/detail/util/optimizer_state.h"

#include <ATen/ATen.h>
#include <torch/optim.h>

#include "tdist/detail/util/torch_compat.h"
#include "tdist/error.h"

namespace tdist::util {
namespace {

class FieldCollector {
 public:
  FieldCollector(const at::Tensor& like, const std::set<std::string>& create)
      : like_(like), create_(create) {}

  bool creating() const { return !create_.empty(); }

  template <typename State, typename Get, typename Set>
  void tensor(State& st, const char* name, Get get, Set set) {
    at::Tensor t = get(st);
    if (!t.defined() && create_.count(name) > 0) {
      t = at::zeros_like(like_, at::MemoryFormat::Contiguous);
      set(st, t);
    }
    if (t.defined()) out_.push_back({name, t, false, {}});
  }

  template <typename State, typename Get, typename Set>
  void step(State& st, Get get, Set set) {
    at::Tensor t = at::scalar_tensor(static_cast<int64_t>(get(st)), at::kLong);
    State* target = &st;
    out_.push_back({"step", t, true, [target, set](int64_t v) { set(*target, v); }});
  }

  std::vector<OptimizerStateField> take() { return std::move(out_); }

 private:
  at::Tensor like_;
  const std::set<std::string>& create_;
  std::vector<OptimizerStateField> out_;
};

template <typename State>
State* find_or_create(torch::optim::Optimizer& optimizer, const at::Tensor& param, bool create) {
  auto& states = optimizer.state();
  const auto key = util::optimizer_state_key(param);
  auto it = states.find(key);
  if (it == states.end()) {
    if (!create) return nullptr;
    it = states.emplace(key, std::make_unique<State>()).first;
  }
  auto* st = dynamic_cast<State*>(it->second.get());
  TDIST_CHECK_ARG(st != nullptr,
                  "optimizer state dict: the optimizer's per-parameter state "
                  "has an unexpected type for its optimizer class");
  return st;
}

template <typename State>
void adam_like(torch::optim::Optimizer& opt, const at::Tensor& p, FieldCollector& f) {
  auto* st = find_or_create<State>(opt, p, f.creating());
  if (st == nullptr) return;
  f.step(
      *st, [](State& s) { return s.step(); }, [](State& s, int64_t v) { s.step(v); });
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

}  // namespace

const std::set<std::string>& optimizer_state_field_names() {
  static const std::set<std::string> fields{"step",           "exp_avg",         "exp_avg_sq",
                                            "max_exp_avg_sq", "momentum_buffer", "sum",
                                            "square_avg",     "grad_avg"};
  return fields;
}

std::vector<OptimizerStateField> optimizer_state_fields(torch::optim::Optimizer& optimizer,
                                                        const at::Tensor& param,
                                                        const at::Tensor& like,
                                                        const std::set<std::string>& create) {
  namespace o = torch::optim;
  FieldCollector f(like, create);
  if (dynamic_cast<o::AdamW*>(&optimizer) != nullptr) {
    adam_like<o::AdamWParamState>(optimizer, param, f);
  } else if (dynamic_cast<o::Adam*>(&optimizer) != nullptr) {
    adam_like<o::AdamParamState>(optimizer, param, f);
  } else if (dynamic_cast<o::SGD*>(&optimizer) != nullptr) {
    using S = o::SGDParamState;
    if (auto* st = find_or_create<S>(optimizer, param, f.creating())) {
      f.tensor(
          *st, "momentum_buffer", [](S& s) { return s.momentum_buffer(); },
          [](S& s, const at::Tensor& t) { s.momentum_buffer(t); });
    }
  } else if (dynamic_cast<o::Adagrad*>(&optimizer) != nullptr) {
    using S = o::AdagradParamState;  // created eagerly by the optimizer
    if (auto* st = find_or_create<S>(optimizer, param, f.creating())) {
      f.step(
          *st, [](S& s) { return s.step(); }, [](S& s, int64_t v) { s.step(v); });
      f.tensor(
          *st, "sum", [](S& s) { return s.sum(); }, [](S& s, const at::Tensor& t) { s.sum(t); });
    }
  } else if (dynamic_cast<o::RMSprop*>(&optimizer) != nullptr) {
    using S = o::RMSpropParamState;
    if (auto* st = find_or_create<S>(optimizer, param, f.creating())) {
      f.step(
          *st, [](S& s) { return s.step(); }, [](S& s, int64_t v) { s.step(v); });
      f.tensor(
          *st, "square_avg", [](S& s) { return s.square_avg(); },
          [](S& s, const at::Tensor& t) { s.square_avg(t); });
      f.tensor(
          *st, "momentum_buffer", [](S& s) { return s.momentum_buffer(); },
          [](S& s, const at::Tensor& t) { s.momentum_buffer(t); });
      f.tensor(
          *st, "grad_avg", [](S& s) { return s.grad_avg(); },
          [](S& s, const at::Tensor& t) { s.grad_avg(t); });
    }
  } else {
    TDIST_THROW(InvalidArgument,
                "optimizer state dict: optimizer type not supported (SGD, Adam, AdamW, Adagrad, "
                "RMSprop are); save its state as a ShardedStateDict yourself");
  }
  return f.take();
}

}  // namespace tdist::util

#include "tdist/checkpoint/optimizer_param_groups.h"

#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <torch/optim.h>

#include "tdist/error.h"
#include "tdist/optim/adam.h"
#include "tdist/optim/sgd.h"

namespace tdist::checkpoint {

namespace {

using nlohmann::json;
using torch::optim::OptimizerOptions;

std::unordered_map<const c10::TensorImpl*, std::string> parameter_names(
    const torch::nn::Module& module) {
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : module.named_parameters(true)) {
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  return names;
}

std::vector<std::string> group_param_names(
    const torch::optim::OptimizerParamGroup& group,
    const std::unordered_map<const c10::TensorImpl*, std::string>& names, const char* op) {
  std::vector<std::string> out;
  for (const auto& p : group.params()) {
    auto it = names.find(p.unsafeGetTensorImpl());
    TDIST_CHECK_ARG(it != names.end(),
                    std::string(op) +
                        ": the optimizer holds a parameter the module does not have; pass the "
                        "module the optimizer was built from");
    out.push_back(it->second);
  }
  return out;
}

// tdist::optim's two fields beyond LibTorch's options. A LibTorch-typed group inside one of
// tdist's optimizers runs with the optimizer's defaults' (library_options.h).
struct Extension {
  bool maximize = false;
  optim::Implementation implementation = optim::Implementation::kDefault;
};

template <class Options>
Extension extension_of(const OptimizerOptions& group, const OptimizerOptions& defaults) {
  const auto* ours = dynamic_cast<const Options*>(&group);
  if (ours == nullptr) ours = dynamic_cast<const Options*>(&defaults);
  if (ours == nullptr) return {};
  return {ours->maximize(), ours->implementation()};
}

// Python's spelling of an implementation: foreach / fused, None meaning "let it choose".
void write_extension(json& g, const Extension& e) {
  g["maximize"] = e.maximize;
  g["foreach"] = e.implementation == optim::Implementation::kForeach   ? json(true)
                 : e.implementation == optim::Implementation::kForLoop ? json(false)
                                                                       : json(nullptr);
  g["fused"] = e.implementation == optim::Implementation::kFused ? json(true) : json(nullptr);
  g["differentiable"] = false;
}

template <class Options>
json adam_family(const Options& o, const Extension& e, bool decoupled) {
  json g = {{"lr", o.lr()},
            {"betas", {std::get<0>(o.betas()), std::get<1>(o.betas())}},
            {"eps", o.eps()},
            {"weight_decay", o.weight_decay()},
            {"amsgrad", o.amsgrad()},
            {"capturable", false},
            {"decoupled_weight_decay", decoupled}};
  write_extension(g, e);
  return g;
}

json group_options(const OptimizerOptions& options, const OptimizerOptions& defaults) {
  if (const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    return adam_family(*o, extension_of<optim::AdamWOptions>(options, defaults), true);
  }
  if (const auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    return adam_family(*o, extension_of<optim::AdamOptions>(options, defaults), false);
  }
  if (const auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    json g = {{"lr", o->lr()},
              {"momentum", o->momentum()},
              {"dampening", o->dampening()},
              {"weight_decay", o->weight_decay()},
              {"nesterov", o->nesterov()}};
    write_extension(g, extension_of<optim::SGDOptions>(options, defaults));
    return g;
  }
  if (const auto* o = dynamic_cast<const torch::optim::AdagradOptions*>(&options)) {
    json g = {{"lr", o->lr()},
              {"lr_decay", o->lr_decay()},
              {"eps", o->eps()},
              {"weight_decay", o->weight_decay()},
              {"initial_accumulator_value", o->initial_accumulator_value()}};
    write_extension(g, {});
    return g;
  }
  if (const auto* o = dynamic_cast<const torch::optim::RMSpropOptions*>(&options)) {
    json g = {
        {"lr", o->lr()},      {"momentum", o->momentum()}, {"alpha", o->alpha()},
        {"eps", o->eps()},    {"centered", o->centered()}, {"weight_decay", o->weight_decay()},
        {"capturable", false}};
    write_extension(g, {});
    return g;
  }
  TDIST_THROW(InvalidArgument,
              "optimizer_param_groups: unsupported optimizer options; supported are "
              "tdist::optim's Adam, AdamW, SGD and torch::optim's Adam, AdamW, SGD, Adagrad, "
              "RMSprop");
}

/// Reads the saved group's values into an optimizer's options; `where` names the group.
class GroupReader {
 public:
  GroupReader(const json& group, std::string where) : g_(group), where_(std::move(where)) {}

  template <class Setter>
  void number(const char* key, Setter set) const {
    if (!g_.contains(key)) return;
    const json& v = g_.at(key);
    TDIST_CHECK_ARG(v.is_number(), where_ + "'s '" + key + "' must be a number, got " + v.dump());
    set(v.get<double>());
  }
  template <class Setter>
  void boolean(const char* key, Setter set) const {
    if (!g_.contains(key)) return;
    const json& v = g_.at(key);
    TDIST_CHECK_ARG(v.is_boolean(),
                    where_ + "'s '" + key + "' must be true or false, got " + v.dump());
    set(v.get<bool>());
  }
  template <class Options>
  void betas(Options& o) const {
    if (!g_.contains("betas")) return;
    const json& v = g_.at("betas");
    TDIST_CHECK_ARG(v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number(),
                    where_ + "'s 'betas' must be two numbers, got " + v.dump());
    o.betas(std::make_tuple(v[0].get<double>(), v[1].get<double>()));
  }

  /// maximize and the implementation, into tdist's options; LibTorch's have neither, so a
  /// saved maximize=true cannot be honoured there.
  template <class Ours>
  void extension(OptimizerOptions& options, const char* libtorch_name) const {
    auto* ours = dynamic_cast<Ours*>(&options);
    if (ours == nullptr) {
      boolean("maximize", [&](bool v) {
        TDIST_CHECK_ARG(!v, where_ + " has maximize=true, which " + libtorch_name +
                                " cannot do; use tdist::optim's optimizer");
      });
      return;
    }
    boolean("maximize", [&](bool v) { ours->maximize(v); });
    const bool has_fused = g_.contains("fused") && g_.at("fused").is_boolean();
    const bool has_foreach = g_.contains("foreach") && g_.at("foreach").is_boolean();
    if (has_fused && g_.at("fused").get<bool>()) {
      ours->implementation(optim::Implementation::kFused);
    } else if (has_foreach) {
      ours->implementation(g_.at("foreach").get<bool>() ? optim::Implementation::kForeach
                                                        : optim::Implementation::kForLoop);
    } else if (g_.contains("foreach") || g_.contains("fused")) {
      ours->implementation(optim::Implementation::kDefault);
    }
  }

 private:
  const json& g_;
  std::string where_;
};

template <class Options>
void read_adam_family(const GroupReader& r, Options& o) {
  r.number("lr", [&](double v) { o.lr(v); });
  r.betas(o);
  r.number("eps", [&](double v) { o.eps(v); });
  r.number("weight_decay", [&](double v) { o.weight_decay(v); });
  r.boolean("amsgrad", [&](bool v) { o.amsgrad(v); });
}

void set_group_options(const GroupReader& r, OptimizerOptions& options) {
  if (auto* o = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    read_adam_family(r, *o);
    r.extension<optim::AdamWOptions>(options, "torch::optim::AdamW");
  } else if (auto* o = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    read_adam_family(r, *o);
    r.extension<optim::AdamOptions>(options, "torch::optim::Adam");
  } else if (auto* o = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
    r.number("lr", [&](double v) { o->lr(v); });
    r.number("momentum", [&](double v) { o->momentum(v); });
    r.number("dampening", [&](double v) { o->dampening(v); });
    r.number("weight_decay", [&](double v) { o->weight_decay(v); });
    r.boolean("nesterov", [&](bool v) { o->nesterov(v); });
    r.extension<optim::SGDOptions>(options, "torch::optim::SGD");
  } else if (auto* o = dynamic_cast<torch::optim::AdagradOptions*>(&options)) {
    r.number("lr", [&](double v) { o->lr(v); });
    r.number("lr_decay", [&](double v) { o->lr_decay(v); });
    r.number("eps", [&](double v) { o->eps(v); });
    r.number("weight_decay", [&](double v) { o->weight_decay(v); });
    r.number("initial_accumulator_value", [&](double v) { o->initial_accumulator_value(v); });
  } else if (auto* o = dynamic_cast<torch::optim::RMSpropOptions*>(&options)) {
    r.number("lr", [&](double v) { o->lr(v); });
    r.number("momentum", [&](double v) { o->momentum(v); });
    r.number("alpha", [&](double v) { o->alpha(v); });
    r.number("eps", [&](double v) { o->eps(v); });
    r.boolean("centered", [&](bool v) { o->centered(v); });
    r.number("weight_decay", [&](double v) { o->weight_decay(v); });
  } else {
    TDIST_THROW(InvalidArgument,
                "set_optimizer_param_groups: unsupported optimizer options; supported are "
                "tdist::optim's Adam, AdamW, SGD and torch::optim's Adam, AdamW, SGD, Adagrad, "
                "RMSprop");
  }
}

}  // namespace

json optimizer_param_groups(const torch::nn::Module& module,
                            const torch::optim::Optimizer& optimizer) {
  const auto names = parameter_names(module);
  json groups = json::array();
  for (const auto& group : optimizer.param_groups()) {
    json g = group_options(group.options(), optimizer.defaults());
    g["params"] = group_param_names(group, names, "optimizer_param_groups");
    groups.push_back(std::move(g));
  }
  return groups;
}

void set_optimizer_param_groups(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                const json& groups) {
  const char* op = "set_optimizer_param_groups";
  TDIST_CHECK_ARG(groups.is_array(),
                  std::string(op) + ": param_groups must be a list, got " + groups.type_name());
  auto& mine = optimizer.param_groups();
  if (groups.size() != mine.size()) {
    TDIST_THROW(InvalidArgument,
                std::string(op) + ": the checkpoint has " + std::to_string(groups.size()) +
                    " param groups, the optimizer " + std::to_string(mine.size()) +
                    "; build the optimizer with the same param groups as the run that saved it");
  }
  const auto names = parameter_names(module);
  for (size_t i = 0; i < mine.size(); ++i) {
    const json& g = groups[i];
    const std::string where = std::string(op) + ": param group " + std::to_string(i);
    TDIST_CHECK_ARG(g.is_object(), where + " must be an object, got " + g.dump());
    if (g.contains("params") && g.at("params").is_array() && !g.at("params").empty() &&
        g.at("params")[0].is_string()) {
      const auto saved = g.at("params").get<std::set<std::string>>();
      const auto own = group_param_names(mine[i], names, op);
      const std::set<std::string> have(own.begin(), own.end());
      for (const auto& name : have) {
        TDIST_CHECK_ARG(saved.count(name),
                        where + ": the optimizer's group holds '" + name +
                            "', which the checkpoint's group " + std::to_string(i) +
                            " does not; build the optimizer's groups as the saving run did");
      }
      for (const auto& name : saved) {
        TDIST_CHECK_ARG(have.count(name), where + ": the checkpoint's group holds '" + name +
                                              "', which the optimizer's group " +
                                              std::to_string(i) + " does not");
      }
    }
    set_group_options(GroupReader(g, where), mine[i].options());
  }
}

}  // namespace tdist::checkpoint

#include "tdist/tensor/parallel/parallelize.h"

#include <fnmatch.h>

#include <mutex>
#include <unordered_map>

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "tdist/error.h"
#include "tensor/parallel/tp_state.h"

namespace tdist::tensor::parallel {
namespace detail {
namespace {

// Module -> its state, as FSDP keeps its own: LibTorch modules have no slot for it. The
// module is held weakly: once it is gone, another module at its address has no style.
struct Registry {
  std::mutex mutex;
  std::unordered_map<const torch::nn::Module*,
                     std::pair<std::weak_ptr<torch::nn::Module>, std::shared_ptr<TPState>>>
      states;
  // Parameters by TensorImpl: FSDP and optimizers keep the parameter object and change only
  // its data, so the impl names the parameter for as long as it lives.
  std::unordered_map<const c10::TensorImpl*,
                     std::pair<c10::weak_intrusive_ptr<c10::TensorImpl>, ParameterPlacement>>
      parameters;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::shared_ptr<TPState> find_state(const torch::nn::Module& module) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.states.find(&module);
  if (it == r.states.end()) return nullptr;
  if (it->second.first.expired()) {
    r.states.erase(it);
    return nullptr;
  }
  return it->second.second;
}

ModuleKind kind_of(const torch::nn::Module& module) {
  if (dynamic_cast<const torch::nn::LinearImpl*>(&module)) return ModuleKind::kLinear;
  if (dynamic_cast<const torch::nn::EmbeddingImpl*>(&module)) return ModuleKind::kEmbedding;
  return ModuleKind::kOther;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (true) {
    const size_t dot = path.find('.', begin);
    parts.push_back(path.substr(begin, dot - begin));
    if (dot == std::string::npos) return parts;
    begin = dot + 1;
  }
}

// A plan key matches a module path part by part, each part an fnmatch pattern, as PyTorch
// walks the key's atoms down the module tree.
bool key_matches(const std::vector<std::string>& key, const std::string& path) {
  const std::vector<std::string> parts = split_path(path);
  if (parts.size() != key.size()) return false;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (fnmatch(key[i].c_str(), parts[i].c_str(), 0) != 0) return false;
  }
  return true;
}

void apply_style(const std::shared_ptr<torch::nn::Module>& module, const std::string& path,
                 const mesh::DeviceMesh& mesh, const StyleRef& style) {
  TDIST_CHECK_ARG(!find_state(*module), "parallelize_module: '" + path +
                                            "' is already parallelized; a module takes one "
                                            "style");
  auto state = std::make_shared<TPState>(style.get(), mesh, kind_of(*module), path);
  partition(*state, *module);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.states[module.get()] =
      std::make_pair(std::weak_ptr<torch::nn::Module>(module), std::move(state));
}

void check_mesh(const mesh::DeviceMesh& mesh) {
  TDIST_CHECK_ARG(mesh.ndim() == 1, "parallelize_module: the mesh " + mesh.to_string() + " is " +
                                        std::to_string(mesh.ndim()) +
                                        "-D; tensor parallelism runs on a 1-D mesh (pass the "
                                        "tensor-parallel dimension, e.g. mesh[\"tp\"])");
}

}  // namespace

void record_placement(const at::Tensor& param, const mesh::DeviceMesh& mesh,
                      const ParameterLayout& layout) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.parameters.insert_or_assign(
      param.unsafeGetTensorImpl(),
      std::make_pair(c10::weak_intrusive_ptr<c10::TensorImpl>(param.getIntrusivePtr()),
                     ParameterPlacement{mesh, layout.placements, layout.global_shape}));
}

TPState& state_of(const torch::nn::Module& module, const char* caller) {
  const std::shared_ptr<TPState> state = find_state(module);
  TDIST_CHECK_ARG(state != nullptr, std::string("tdist::tensor::parallel::") + caller + ": " +
                                        module.name() +
                                        " has no tensor-parallel style; apply one with "
                                        "parallelize_module first");
  return *state;
}

}  // namespace detail

void parallelize_module(const std::shared_ptr<torch::nn::Module>& module,
                        const mesh::DeviceMesh& mesh, const ParallelizePlan& plan) {
  detail::check_mesh(mesh);
  const auto modules = module->named_modules();
  for (const auto& [key, style] : plan) {
    const std::vector<std::string> atoms = detail::split_path(key);
    bool matched = false;
    for (const auto& item : modules) {
      if (item.key().empty() || !detail::key_matches(atoms, item.key())) continue;
      detail::apply_style(item.value(), item.key(), mesh, style);
      matched = true;
    }
    TDIST_CHECK_ARG(matched, "parallelize_module: plan key '" + key + "' (" +
                                 style.get()->to_string() + ") matches no submodule of " +
                                 module->name() +
                                 "; keys are paths as named_modules() gives them, each part "
                                 "an fnmatch pattern (\"layers.*.mlp.up_proj\")");
  }
}

void parallelize_module(const std::shared_ptr<torch::nn::Module>& module,
                        const mesh::DeviceMesh& mesh, const StyleRef& style) {
  detail::check_mesh(mesh);
  detail::apply_style(module, "", mesh, style);
}

std::optional<ParameterPlacement> parameter_placement(const at::Tensor& param) {
  detail::Registry& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.parameters.find(param.unsafeGetTensorImpl());
  if (it == r.parameters.end()) return std::nullopt;
  if (it->second.first.expired()) {  // another tensor now lives at that address
    r.parameters.erase(it);
    return std::nullopt;
  }
  return it->second.second;
}

std::shared_ptr<const ParallelStyle> style_of(const torch::nn::Module& module) {
  const auto state = detail::find_state(module);
  return state ? state->style : nullptr;
}

DTensor parameter_dtensor(const torch::nn::Module& module, const std::string& name) {
  const detail::TPState& state = detail::state_of(module, "parameter_dtensor");
  const auto it = state.parameters.find(name);
  TDIST_CHECK_ARG(it != state.parameters.end(), "parameter_dtensor: '" + state.path +
                                                    "' has no parameter '" + name +
                                                    "' that its style distributed");
  const auto parameters = module.named_parameters();
  const at::Tensor* local = parameters.find(name);
  TDIST_CHECK_ARG(local != nullptr, "parameter_dtensor: '" + state.path +
                                        "' no longer has a parameter '" + name + "'");
  return DTensor::from_local(*local, state.mesh, it->second.placements,
                             FromLocalOptions().shape(it->second.global_shape));
}

}  // namespace tdist::tensor::parallel

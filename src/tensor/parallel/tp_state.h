#pragma once

// What parallelize_module leaves on a module: its style, the mesh, what kind of module the
// style computes for, and the DTensor layout of each parameter it sharded.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "tdist/mesh/device_mesh.h"
#include "tdist/tensor/parallel/parallelize.h"
#include "tdist/tensor/parallel/style.h"

namespace tdist::tensor::parallel::detail {

enum class ModuleKind { kLinear, kEmbedding, kOther };

struct ParameterLayout {
  Placements placements;
  std::vector<int64_t> global_shape;
};

class TPState {
 public:
  TPState(std::shared_ptr<const ParallelStyle> style, mesh::DeviceMesh mesh, ModuleKind kind,
          std::string path)
      : style(std::move(style)), mesh(std::move(mesh)), kind(kind), path(std::move(path)) {}

  std::shared_ptr<const ParallelStyle> style;
  mesh::DeviceMesh mesh;
  ModuleKind kind;
  /// The module's path in the parallelized tree, for errors ("" for the root).
  std::string path;
  std::map<std::string, ParameterLayout> parameters;
};

/// Records where `param` lies, for parameter_placement.
void record_placement(const at::Tensor& param, const mesh::DeviceMesh& mesh,
                      const ParameterLayout& layout);

/// Shards `module`'s parameters as `state.style` says and records their layouts.
void partition(TPState& state, torch::nn::Module& module);

}  // namespace tdist::tensor::parallel::detail

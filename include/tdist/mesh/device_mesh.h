#pragma once

// DeviceMesh: an n-D array of global ranks with named dimensions, and one process group per
// dimension (torch.distributed.device_mesh). init_device_mesh builds it; slicing by name
// gives a sub-mesh that reuses the parent's groups.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tdist/comm/process_group.h"

namespace tdist::mesh {

/// A mesh dimension named by index or by name (for backend_override and lookups).
using MeshDim = std::variant<int, std::string>;

class DeviceMesh {
 public:
  /// Builds a mesh over `layout` (row-major, product of `shape` entries) with the groups of
  /// each dimension already created. Prefer init_device_mesh; this is for slicing and tests.
  DeviceMesh(std::string device_type, std::vector<int64_t> shape, std::vector<int> layout,
             std::vector<std::string> dim_names, std::vector<ProcessGroupPtr> dim_groups,
             std::vector<int64_t> coordinate);

  const std::string& device_type() const { return device_type_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  /// Global ranks in row-major order (the mesh's "tensor").
  const std::vector<int>& layout() const { return layout_; }
  /// Dimension names; empty when the mesh was built without names.
  const std::vector<std::string>& mesh_dim_names() const { return dim_names_; }
  /// Number of ranks in the whole mesh, or along one dimension.
  int64_t size() const;
  int64_t size(const MeshDim& dim) const;

  /// The process group of one dimension. Without argument: only for 1-D meshes.
  ProcessGroupPtr get_group(const MeshDim& dim) const;
  ProcessGroupPtr get_group() const;
  std::vector<ProcessGroupPtr> get_all_groups() const { return dim_groups_; }
  /// This rank's index along `dim` (its rank in get_group(dim)).
  int get_local_rank(const MeshDim& dim) const;
  int get_local_rank() const;
  /// This rank's coordinate in the mesh (one index per dimension).
  const std::vector<int64_t>& get_coordinate() const { return coordinate_; }
  /// This process's global rank.
  int get_rank() const;

  /// The sub-mesh along the named dimensions (in the order given), through this rank; it
  /// shares the parent's process groups. mesh["dp"] is the 1-D mesh of this rank's dp group.
  DeviceMesh operator[](const std::string& dim_name) const;
  DeviceMesh operator[](const std::vector<std::string>& dim_names) const;

  /// "DeviceMesh(cpu, shape=(2, 2), dims=(dp, tp), layout=[0, 1, 2, 3])".
  std::string to_string() const;

 private:
  int dim_index(const MeshDim& dim) const;

  std::string device_type_;
  std::vector<int64_t> shape_;
  std::vector<int> layout_;
  std::vector<std::string> dim_names_;
  std::vector<ProcessGroupPtr> dim_groups_;
  std::vector<int64_t> coordinate_;
};

/// Creates the mesh `mesh_shape` over all ranks of the world (initialising the default
/// process group from env:// if needed) and one group per dimension. Every rank must call it
/// with the same arguments; a mismatch across ranks raises on every rank instead of hanging.
/// Errors (InvalidArgument): a device type with an index ("cuda:0"), a shape whose product
/// is not the world size, names of the wrong count, empty or duplicate names.
/// `backend_override` maps a dimension (index or name) to the backend of its groups.
DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names = {},
                            const std::map<MeshDim, std::string>& backend_override = {});

namespace detail {
/// The ranks of every 1-D group along `dim` of a row-major mesh of `shape` over `layout`, in
/// the order every rank creates them (row-major over the other dimensions). Pure.
std::vector<std::vector<int>> groups_along_dim(const std::vector<int64_t>& shape,
                                               const std::vector<int>& layout, int dim);
}  // namespace detail

}  // namespace tdist::mesh

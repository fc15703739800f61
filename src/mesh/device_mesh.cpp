#include "tdist/mesh/device_mesh.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "tdist/comm/distributed.h"
#include "tdist/comm/object_collectives.h"
#include "tdist/detail/util/text.h"
#include "tdist/error.h"

namespace tdist::mesh {

namespace {

/// A list written as Python writes a tuple: (2, 3).
template <typename T>
std::string join_list(const std::vector<T>& values) {
  return "(" + util::join(values) + ")";
}

std::string dim_text(const MeshDim& dim) {
  return std::holds_alternative<int>(dim) ? std::to_string(std::get<int>(dim))
                                          : "'" + std::get<std::string>(dim) + "'";
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t p = 1;
  for (auto s : shape) p *= s;
  return p;
}

/// Row-major strides of `shape`.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * shape[i + 1];
  }
  return strides;
}

/// The text every rank exchanges to check it was called with the same arguments.
std::string call_signature(const std::string& device_type, const std::vector<int64_t>& shape,
                           const std::vector<std::string>& names,
                           const std::map<MeshDim, std::string>& backend_override) {
  std::ostringstream out;
  out << "device_type='" << device_type << "' mesh_shape=" << join_list(shape)
      << " mesh_dim_names=" << join_list(names);
  if (!backend_override.empty()) {
    out << " backend_override={";
    for (const auto& [dim, backend] : backend_override)
      out << dim_text(dim) << ": " << backend << " ";
    out << "}";
  }
  return out.str();
}

void validate(const std::string& device_type, const std::vector<int64_t>& shape,
              const std::vector<std::string>& names, int world, int rank) {
  const std::string where = "rank " + std::to_string(rank) + ": init_device_mesh: ";
  if (device_type.find(':') != std::string::npos) {
    TDIST_THROW(InvalidArgument, where + "device_type '" + device_type +
                                     "' has a device index; pass the type only (e.g. '" +
                                     device_type.substr(0, device_type.find(':')) +
                                     "') and select each rank's device yourself");
  }
  if (device_type.empty()) TDIST_THROW(InvalidArgument, where + "device_type is empty");
  if (shape.empty()) TDIST_THROW(InvalidArgument, where + "mesh_shape is empty");
  for (auto s : shape) {
    if (s <= 0) {
      TDIST_THROW(InvalidArgument,
                  where + "mesh_shape " + join_list(shape) + " has a non-positive size");
    }
  }
  if (product(shape) != world) {
    TDIST_THROW(InvalidArgument, where + "mesh_shape " + join_list(shape) + " has " +
                                     std::to_string(product(shape)) + " ranks but the world has " +
                                     std::to_string(world) +
                                     "; give a shape whose product is the world size");
  }
  if (!names.empty()) {
    if (names.size() != shape.size()) {
      TDIST_THROW(InvalidArgument, where + "mesh_dim_names " + join_list(names) + " has " +
                                       std::to_string(names.size()) + " names for a " +
                                       std::to_string(shape.size()) +
                                       "-D mesh_shape; give one name per dimension");
    }
    std::set<std::string> seen;
    for (const auto& n : names) {
      if (n.empty()) TDIST_THROW(InvalidArgument, where + "mesh_dim_names has an empty name");
      if (!seen.insert(n).second) {
        TDIST_THROW(InvalidArgument, where + "mesh_dim_names " + join_list(names) + " repeats '" +
                                         n + "'; names must be unique");
      }
    }
  }
}

}  // namespace

namespace detail {

std::vector<std::vector<int>> groups_along_dim(const std::vector<int64_t>& shape,
                                               const std::vector<int>& layout, int dim) {
  const auto strides = strides_of(shape);
  const int64_t total = product(shape);
  std::vector<std::vector<int>> groups;
  // Every flat index whose coordinate along `dim` is 0 starts one group; visiting them in
  // increasing order is row-major over the other dimensions.
  for (int64_t start = 0; start < total; ++start) {
    if ((start / strides[dim]) % shape[dim] != 0) continue;
    std::vector<int> ranks;
    for (int64_t i = 0; i < shape[dim]; ++i) ranks.push_back(layout[start + i * strides[dim]]);
    groups.push_back(std::move(ranks));
  }
  return groups;
}

}  // namespace detail

DeviceMesh::DeviceMesh(std::string device_type, std::vector<int64_t> shape, std::vector<int> layout,
                       std::vector<std::string> dim_names, std::vector<ProcessGroupPtr> dim_groups,
                       std::vector<int64_t> coordinate)
    : device_type_(std::move(device_type)),
      shape_(std::move(shape)),
      layout_(std::move(layout)),
      dim_names_(std::move(dim_names)),
      dim_groups_(std::move(dim_groups)),
      coordinate_(std::move(coordinate)) {
  TDIST_CHECK_ARG(static_cast<int64_t>(layout_.size()) == product(shape_),
                  "DeviceMesh: layout has " + std::to_string(layout_.size()) + " ranks but shape " +
                      join_list(shape_) + " needs " + std::to_string(product(shape_)));
  TDIST_CHECK_ARG(dim_groups_.size() == shape_.size() && coordinate_.size() == shape_.size(),
                  "DeviceMesh: need one group and one coordinate per dimension");
  TDIST_CHECK_ARG(dim_names_.empty() || dim_names_.size() == shape_.size(),
                  "DeviceMesh: need one name per dimension");
}

int64_t DeviceMesh::size() const {
  return product(shape_);
}
int64_t DeviceMesh::size(const MeshDim& dim) const {
  return shape_[dim_index(dim)];
}

int DeviceMesh::dim_index(const MeshDim& dim) const {
  if (std::holds_alternative<int>(dim)) {
    int i = std::get<int>(dim);
    if (i < 0) i += ndim();
    if (i < 0 || i >= ndim()) {
      TDIST_THROW(InvalidArgument, "DeviceMesh: dimension " + dim_text(dim) +
                                       " is out of range for a " + std::to_string(ndim()) +
                                       "-D mesh");
    }
    return i;
  }
  const auto& name = std::get<std::string>(dim);
  auto it = std::find(dim_names_.begin(), dim_names_.end(), name);
  if (it == dim_names_.end()) {
    TDIST_THROW(InvalidArgument, "DeviceMesh: no dimension named '" + name +
                                     "'; the mesh has dimensions " + join_list(dim_names_));
  }
  return static_cast<int>(it - dim_names_.begin());
}

ProcessGroupPtr DeviceMesh::get_group(const MeshDim& dim) const {
  return dim_groups_[dim_index(dim)];
}

ProcessGroupPtr DeviceMesh::get_group() const {
  if (ndim() != 1) {
    TDIST_THROW(InvalidArgument, "DeviceMesh::get_group(): the mesh is " + std::to_string(ndim()) +
                                     "-D; name the dimension (get_group(\"dp\")) or slice it");
  }
  return dim_groups_[0];
}

int DeviceMesh::get_local_rank(const MeshDim& dim) const {
  return static_cast<int>(coordinate_[dim_index(dim)]);
}

int DeviceMesh::get_local_rank() const {
  if (ndim() != 1) {
    TDIST_THROW(InvalidArgument, "DeviceMesh::get_local_rank(): the mesh is " +
                                     std::to_string(ndim()) + "-D; name the dimension");
  }
  return static_cast<int>(coordinate_[0]);
}

int DeviceMesh::get_rank() const {
  const auto strides = strides_of(shape_);
  int64_t flat = 0;
  for (int i = 0; i < ndim(); ++i) flat += coordinate_[i] * strides[i];
  return layout_[flat];
}

DeviceMesh DeviceMesh::operator[](const std::string& dim_name) const {
  return (*this)[std::vector<std::string>{dim_name}];
}

DeviceMesh DeviceMesh::operator[](const std::vector<std::string>& names) const {
  TDIST_CHECK_ARG(!names.empty(), "DeviceMesh slicing needs at least one dimension name");
  std::vector<int> dims;
  for (const auto& n : names) {
    int d = dim_index(n);
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) {
      TDIST_THROW(InvalidArgument, "DeviceMesh: slice names '" + n + "' twice");
    }
    dims.push_back(d);
  }
  std::vector<int64_t> sub_shape, sub_coord;
  std::vector<ProcessGroupPtr> sub_groups;
  for (int d : dims) {
    sub_shape.push_back(shape_[d]);
    sub_coord.push_back(coordinate_[d]);
    sub_groups.push_back(dim_groups_[d]);
  }
  // Walk the sub-mesh row-major, the other dimensions fixed at this rank's coordinate.
  const auto strides = strides_of(shape_);
  int64_t base = 0;
  for (int i = 0; i < ndim(); ++i) {
    if (std::find(dims.begin(), dims.end(), i) == dims.end()) base += coordinate_[i] * strides[i];
  }
  std::vector<int> sub_layout;
  const int64_t total = product(sub_shape);
  const auto sub_strides = strides_of(sub_shape);
  for (int64_t flat = 0; flat < total; ++flat) {
    int64_t offset = base;
    for (size_t k = 0; k < dims.size(); ++k) {
      offset += ((flat / sub_strides[k]) % sub_shape[k]) * strides[dims[k]];
    }
    sub_layout.push_back(layout_[offset]);
  }
  return DeviceMesh(device_type_, sub_shape, sub_layout, names, sub_groups, sub_coord);
}

std::string DeviceMesh::to_string() const {
  std::ostringstream out;
  out << "DeviceMesh(" << device_type_ << ", shape=" << join_list(shape_);
  if (!dim_names_.empty()) out << ", dims=" << join_list(dim_names_);
  out << ", layout=[" << util::join(layout_) << "])";
  return out.str();
}

DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names,
                            const std::map<MeshDim, std::string>& backend_override) {
  if (!is_initialized()) {
    // Reject an indexed device type before anything can block.
    validate(device_type, mesh_shape, mesh_dim_names, static_cast<int>(product(mesh_shape)), -1);
    init_process_group(
        InitProcessGroupOptions().backend(get_default_backend_for_device(device_type)));
  }
  const int world = get_world_size();
  const int rank = get_rank();

  // Note [Mesh agreement]: the arguments are compared across ranks before any local check,
  // so every rank sees the same data and raises the same error instead of some ranks
  // hanging in a collective the others never issue.
  const std::string mine =
      call_signature(device_type, mesh_shape, mesh_dim_names, backend_override);
  std::vector<Object> all;
  all_gather_object(all, Object(mine));
  const auto differs = std::find_if(
      all.begin(), all.end(), [&](const Object& o) { return o.as_string() != all[0].as_string(); });
  if (differs != all.end()) {
    const auto bad = differs - all.begin();
    TDIST_THROW(InvalidArgument, "rank " + std::to_string(rank) +
                                     ": init_device_mesh was called with different arguments "
                                     "across ranks: rank 0 gave " +
                                     all[0].as_string() + " but rank " + std::to_string(bad) +
                                     " gave " + differs->as_string() +
                                     "; every rank must build the same mesh");
  }
  validate(device_type, mesh_shape, mesh_dim_names, world, rank);

  std::vector<std::string> overrides(mesh_shape.size());
  for (const auto& [dim, backend] : backend_override) {
    int d = -1;
    if (std::holds_alternative<int>(dim)) {
      d = std::get<int>(dim);
    } else {
      auto it = std::find(mesh_dim_names.begin(), mesh_dim_names.end(), std::get<std::string>(dim));
      if (it != mesh_dim_names.end()) d = static_cast<int>(it - mesh_dim_names.begin());
    }
    if (d < 0 || d >= static_cast<int>(mesh_shape.size())) {
      TDIST_THROW(InvalidArgument, "rank " + std::to_string(rank) +
                                       ": init_device_mesh: backend_override names dimension " +
                                       dim_text(dim) + ", which the mesh " +
                                       join_list(mesh_dim_names) + " does not have");
    }
    overrides[d] = backend;
  }

  std::vector<int> layout(world);
  for (int r = 0; r < world; ++r) layout[r] = r;
  std::vector<int64_t> coordinate(mesh_shape.size());
  const auto strides = strides_of(mesh_shape);
  for (size_t d = 0; d < mesh_shape.size(); ++d)
    coordinate[d] = (rank / strides[d]) % mesh_shape[d];

  // Every rank creates every group of every dimension in the same order (new_group is
  // collective over the world); it keeps the one it belongs to.
  std::vector<ProcessGroupPtr> groups(mesh_shape.size());
  for (size_t d = 0; d < mesh_shape.size(); ++d) {
    if (mesh_shape[d] == world && overrides[d].empty()) {
      groups[d] = group_world();  // a 1-D mesh (or a full dimension) is the world group
      continue;
    }
    for (const auto& ranks : detail::groups_along_dim(mesh_shape, layout, static_cast<int>(d))) {
      auto pg = new_group(ranks, NewGroupOptions().backend(overrides[d]));
      if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end()) groups[d] = pg;
    }
  }
  return DeviceMesh(device_type, mesh_shape, layout, mesh_dim_names, groups, coordinate);
}

}  // namespace tdist::mesh

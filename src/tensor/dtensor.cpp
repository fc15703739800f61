#include "tdist/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>

#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tensor/redistribute.h"

namespace tdist::tensor {
namespace {

using mesh::DeviceMesh;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A move between two layouts of one global tensor, kept in the autograd context, and the
// layout the gradient of the moved tensor arrives in (by default `to`, normalized).
struct LayoutChange : public torch::CustomClassHolder {
  LayoutChange(DeviceMesh mesh, Placements from, Placements to, std::vector<int64_t> shape,
               std::optional<Placements> grad)
      : mesh(std::move(mesh)),
        from(std::move(from)),
        to(std::move(to)),
        shape(std::move(shape)),
        grad(grad ? std::move(*grad) : normalize_placements_for_grad(this->to)) {}
  DeviceMesh mesh;
  Placements from;
  Placements to;
  std::vector<int64_t> shape;
  Placements grad;
};

c10::intrusive_ptr<LayoutChange> change_in(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<LayoutChange>(ctx->saved_data["change"].toCapsule());
}

// Forward: the move. Backward: the gradient moved back, from the placements it has (the
// destination's, normalized, unless the move said otherwise) to the source's normalized
// placements (Note [DTensor autograd]).
struct RedistributeFunction : public torch::autograd::Function<RedistributeFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& local, c10::IValue change) {
    ctx->saved_data["change"] = change;
    const auto c = c10::static_intrusive_pointer_cast<LayoutChange>(change.toCapsule());
    return {detail::redistribute_local(local, c->mesh, c->from, c->to, c->shape)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto c = change_in(ctx);
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    return {detail::redistribute_local(grads[0].contiguous(), c->mesh, c->grad,
                                       normalize_placements_for_grad(c->from), c->shape),
            at::Tensor()};
  }
};

// to_local with grad_placements: the local tensor itself forward; backward, the gradient the
// caller's computation produced (in `from`) moved into the DTensor's layout (`to`).
struct ToLocalFunction : public torch::autograd::Function<ToLocalFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& local, c10::IValue change) {
    ctx->saved_data["change"] = change;
    return {local.view_as(local)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto c = change_in(ctx);
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    return {detail::redistribute_local(grads[0].contiguous(), c->mesh, c->from, c->to, c->shape),
            at::Tensor()};
  }
};

c10::IValue capsule(const DeviceMesh& mesh, Placements from, Placements to,
                    std::vector<int64_t> shape, std::optional<Placements> grad = std::nullopt) {
  return c10::IValue::make_capsule(c10::make_intrusive<LayoutChange>(
      mesh, std::move(from), std::move(to), std::move(shape), std::move(grad)));
}

std::vector<int64_t> contiguous_strides_of(const std::vector<int64_t>& shape) {
  const auto strides = c10::contiguous_strides(shape);
  return {strides.begin(), strides.end()};
}

// PyTorch's compute_global_tensor_info: shards assumed even, strides of the dimensions
// outside a sharded one scaled by the mesh dimension's size.
std::pair<std::vector<int64_t>, std::vector<int64_t>> even_global_info(
    const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements) {
  std::vector<int64_t> shape = local.sizes().vec();
  std::vector<int64_t> stride = local.strides().vec();
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (!is_shard(placements[i])) continue;
    const int64_t d = shard_dim(placements[i]);
    const int64_t k = mesh.size(i);
    shape[d] *= k;
    for (size_t j = 0; j < stride.size(); ++j) {
      if (static_cast<int64_t>(j) != d && stride[j] >= stride[d]) stride[j] *= k;
    }
  }
  return {shape, stride};
}

// Note [from_local run_check]: one all-gather of (dtype, ndim, extents) per mesh dimension,
// right to left, turns this rank's extents into the extents each level splits (the sum of
// its group's shards), checking on the way that the group agrees on dtype, rank and every
// unsplit extent, and that its shards are torch.chunk's; then the verdict is all-reduced
// along every mesh dimension, so every rank raises or none does.
constexpr int64_t kMaxCheckedDims = 16;

std::vector<int64_t> checked_global_shape(const at::Tensor& local, const DeviceMesh& mesh,
                                          const Placements& placements) {
  const int64_t ndim = local.dim();
  TDIST_CHECK_ARG(ndim <= kMaxCheckedDims, "DTensor::from_local(run_check): a " +
                                               std::to_string(ndim) +
                                               "-D tensor; run_check "
                                               "handles up to 16 dimensions");
  std::vector<int64_t> extents = local.sizes().vec();
  std::string problem;
  for (int i = mesh.ndim() - 1; i >= 0; --i) {
    const ProcessGroupPtr group = mesh.get_group(i);
    const int64_t k = group->size();
    at::Tensor mine = at::full({kMaxCheckedDims + 2}, -1, at::kLong);
    mine[0] = static_cast<int64_t>(local.scalar_type());
    mine[1] = ndim;
    for (int64_t d = 0; d < ndim; ++d) mine[d + 2] = extents[d];
    at::Tensor all = at::empty({k, kMaxCheckedDims + 2}, at::kLong);
    all_gather_into_tensor(all, mine, group);
    const auto rows = all.accessor<int64_t, 2>();
    for (int64_t r = 0; r < k && problem.empty(); ++r) {
      if (rows[r][0] != rows[0][0] || rows[r][1] != ndim) {
        problem = "along mesh dimension " + std::to_string(i) + ", rank " + std::to_string(r) +
                  " of the group has a " + std::to_string(rows[r][1]) + "-D tensor of dtype " +
                  c10::toString(static_cast<at::ScalarType>(rows[r][0])) + ", this rank a " +
                  std::to_string(ndim) + "-D " + c10::toString(local.scalar_type());
      }
    }
    for (int64_t d = 0; d < ndim && problem.empty(); ++d) {
      const bool split = is_shard(placements[i], d);
      int64_t sum = 0;
      for (int64_t r = 0; r < k; ++r) sum += rows[r][d + 2];
      for (int64_t r = 0; r < k && problem.empty(); ++r) {
        const int64_t want = split ? local_shard_size_and_offset(sum, k, r).first : rows[0][d + 2];
        if (rows[r][d + 2] != want) {
          problem = "along mesh dimension " + std::to_string(i) + ", rank " + std::to_string(r) +
                    " of the group holds " + std::to_string(rows[r][d + 2]) +
                    " along tensor dimension " + std::to_string(d) + " where " +
                    (split ? "torch.chunk's shard of " + std::to_string(sum) + " is "
                           : "the group's first rank holds ") +
                    std::to_string(want);
        }
      }
      if (split) extents[d] = sum;
    }
  }
  at::Tensor failed = at::full({1}, problem.empty() ? 0 : 1, at::kInt);
  for (int i = 0; i < mesh.ndim(); ++i) all_reduce(failed, ReduceOp::MAX, mesh.get_group(i));
  if (failed.item<int>() != 0) {
    TDIST_THROW(
        InvalidArgument,
        "DTensor::from_local(run_check): the local tensors do not form one tensor with "
        "placements " +
            to_string(placements) + ": " +
            (problem.empty() ? std::string("another rank found the mismatch (see its error)")
                             : problem));
  }
  return extents;
}

at::Tensor replicated_from(const at::Tensor& t, const ProcessGroupPtr& group,
                           std::optional<int> src) {
  at::Tensor copy = t.clone(at::MemoryFormat::Contiguous);
  if (src) broadcast(copy, group->global_rank(*src), group);
  return copy;
}

}  // namespace

DTensor::DTensor(at::Tensor local, DeviceMesh mesh, Placements placements,
                 std::vector<int64_t> shape, std::vector<int64_t> stride)
    : local_(std::move(local)),
      mesh_(std::move(mesh)),
      placements_(std::move(placements)),
      shape_(std::move(shape)),
      stride_(std::move(stride)) {}

DTensor DTensor::from_local(const at::Tensor& local, const DeviceMesh& mesh, Placements placements,
                            const FromLocalOptions& options) {
  TDIST_CHECK_ARG(local.defined(), "DTensor::from_local: the local tensor is undefined");
  placements =
      detail::checked_placements(std::move(placements), mesh, local.dim(), "DTensor::from_local");
  auto [shape, stride] = even_global_info(local, mesh, placements);
  if (options.run_check()) {
    shape = checked_global_shape(local, mesh, placements);
    if (local.is_contiguous()) stride = contiguous_strides_of(shape);
    for (int i = 0; i < mesh.ndim(); ++i) {
      if (!is_replicate(placements[i])) continue;
      TDIST_CHECK_ARG(local.is_contiguous(),
                      "DTensor::from_local(run_check): a Replicate placement broadcasts the "
                      "first rank's data into the local tensor, which must be contiguous");
      at::NoGradGuard no_grad;
      at::Tensor data = local.detach();
      broadcast(data, mesh.get_group(i)->global_rank(0), mesh.get_group(i));
    }
  }
  if (options.shape()) {
    TDIST_CHECK_ARG(static_cast<int64_t>(options.shape()->size()) == local.dim(),
                    "DTensor::from_local: shape " + c10::str(c10::IntArrayRef(*options.shape())) +
                        " for a " + std::to_string(local.dim()) + "-D local tensor");
    shape = *options.shape();
    stride = options.stride().value_or(contiguous_strides_of(shape));
    const auto expected = compute_local_shape_and_global_offset(shape, mesh, placements).first;
    TDIST_CHECK_ARG(
        expected == local.sizes().vec(),
        "DTensor::from_local: this rank's local tensor has shape " + c10::str(local.sizes()) +
            ", but its part of shape " + c10::str(c10::IntArrayRef(shape)) + " with placements " +
            tensor::to_string(placements) + " is " + c10::str(c10::IntArrayRef(expected)));
  } else if (options.stride()) {
    stride = *options.stride();
  }
  return DTensor(local, mesh, std::move(placements), std::move(shape), std::move(stride));
}

at::Tensor DTensor::to_local(const std::optional<Placements>& grad_placements) const {
  if (!grad_placements) return local_;
  Placements from = detail::checked_placements(*grad_placements, mesh_, dim(),
                                               "DTensor::to_local(grad_placements)");
  Placements to = normalize_placements_for_grad(placements_);
  if (from == to || !local_.requires_grad()) return local_;
  return ToLocalFunction::apply(local_, capsule(mesh_, std::move(from), std::move(to), shape_))[0];
}

at::Tensor DTensor::full_tensor(const std::optional<Placements>& grad_placements) const {
  return redistribute(Placements(mesh_.ndim(), Replicate())).to_local(grad_placements);
}

DTensor DTensor::redistribute(Placements placements) const {
  placements =
      detail::checked_placements(std::move(placements), mesh_, dim(), "DTensor::redistribute");
  for (size_t i = 0; i < placements.size(); ++i) {
    TDIST_CHECK_ARG(!is_partial(placements[i]) || placements[i] == placements_[i],
                    "DTensor::redistribute: from " + tensor::to_string(placements_[i]) + " to " +
                        tensor::to_string(placements[i]) + " on mesh dimension " +
                        std::to_string(i) +
                        "; moving to Partial is for internal use only, as in PyTorch (use "
                        "distribute_tensor or from_local to make a Partial DTensor)");
  }
  if (placements == placements_) return *this;
  at::Tensor local;
  if (local_.requires_grad() && at::GradMode::is_enabled()) {
    local = RedistributeFunction::apply(local_, capsule(mesh_, placements_, placements, shape_))[0];
  } else {
    at::NoGradGuard no_grad;
    local = detail::redistribute_local(local_, mesh_, placements_, placements, shape_);
  }
  return DTensor(std::move(local), mesh_, std::move(placements), shape_, stride_);
}

namespace detail {

at::Tensor moved_local(const DTensor& source, Placements to, Placements grad) {
  const DeviceMesh& mesh = source.device_mesh();
  to = checked_placements(std::move(to), mesh, source.dim(), "redistribute");
  grad = checked_placements(std::move(grad), mesh, source.dim(), "redistribute (gradient)");
  const at::Tensor& local = source.to_local();
  if (!local.requires_grad() || !at::GradMode::is_enabled()) {
    at::NoGradGuard no_grad;
    return redistribute_local(local, mesh, source.placements(), to, source.shape());
  }
  return RedistributeFunction::apply(
      local, capsule(mesh, source.placements(), std::move(to), source.shape(), std::move(grad)))[0];
}

}  // namespace detail

int64_t DTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

std::string DTensor::to_string() const {
  return "DTensor(shape=" + c10::str(c10::IntArrayRef(shape_)) +
         ", placements=" + tensor::to_string(placements_) + ", mesh=" + mesh_.to_string() + ")";
}

DTensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh, Placements placements,
                          std::optional<int> src_data_rank) {
  TDIST_CHECK_ARG(tensor.defined(), "distribute_tensor: the tensor is undefined");
  placements =
      detail::checked_placements(std::move(placements), mesh, tensor.dim(), "distribute_tensor");
  for (int i = 0; i < mesh.ndim() && src_data_rank; ++i) {
    TDIST_CHECK_ARG(*src_data_rank >= 0 && *src_data_rank < mesh.size(i),
                    "distribute_tensor: src_data_rank " + std::to_string(*src_data_rank) +
                        " is outside mesh dimension " + std::to_string(i) + "'s " +
                        std::to_string(mesh.size(i)) + " ranks");
  }
  at::NoGradGuard no_grad;
  at::Tensor t = tensor.detach();
  if (t.device().type() != c10::Device(mesh.device_type()).type()) {
    t = t.to(c10::Device(mesh.device_type()));
  }
  for (int i = 0; i < mesh.ndim(); ++i) {
    const ProcessGroupPtr group = mesh.get_group(i);
    if (is_shard(placements[i])) {
      t = detail::scatter_shards(t, shard_dim(placements[i]), group, src_data_rank);
    } else {
      t = replicated_from(t, group, src_data_rank);
      if (is_partial(placements[i])) {
        t = detail::partition_value(t, std::get<Partial>(placements[i]).reduce_op, group->size());
      }
    }
  }
  t.requires_grad_(tensor.requires_grad());
  return DTensor::from_local(
      t, mesh, std::move(placements),
      FromLocalOptions().shape(tensor.sizes().vec()).stride(tensor.strides().vec()));
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> compute_local_shape_and_global_offset(
    const std::vector<int64_t>& global_shape, const DeviceMesh& mesh,
    const Placements& placements) {
  std::vector<int64_t> shape = global_shape;
  std::vector<int64_t> offset(global_shape.size(), 0);
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (!is_shard(placements.at(i))) continue;
    const int64_t d = shard_dim(placements[i]);
    const auto [length, begin] =
        local_shard_size_and_offset(shape.at(d), mesh.size(i), mesh.get_local_rank(i));
    shape[d] = length;
    offset[d] += begin;
  }
  return {shape, offset};
}

}  // namespace tdist::tensor

#include "tensor/redistribute.h"

#include <ATen/ATen.h>

#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::tensor::detail {
namespace {

using mesh::DeviceMesh;

// The extent of tensor dimension `d` that mesh dimension `i` splits: the global extent
// narrowed by the shards of the mesh dimensions before `i` that split `d` now.
int64_t level_extent(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh,
                     const Placements& current, int64_t d, int i) {
  int64_t extent = global_shape[d];
  for (int j = 0; j < i; ++j) {
    if (is_shard(current[j], d)) {
      extent = local_shard_size_and_offset(extent, mesh.size(j), mesh.get_local_rank(j)).first;
    }
  }
  return extent;
}

at::Tensor padded_along(const at::Tensor& t, int64_t d, int64_t length) {
  if (t.size(d) == length) return t;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[d] = length - t.size(d);
  return at::cat({t, at::zeros(shape, t.options())}, d);
}

// Collectives run on dimension 0 of a contiguous tensor: `d` moves to the front and back.
at::Tensor to_front(const at::Tensor& t, int64_t d) {
  return t.movedim(d, 0).contiguous();
}
at::Tensor from_front(const at::Tensor& t, int64_t d) {
  return t.movedim(0, d).contiguous();
}

// Shard(d) -> Replicate along one mesh dimension: every rank's shard of an extent-`n`
// dimension, padded to torch.chunk's chunk length, gathered and trimmed.
at::Tensor gather_shards(const at::Tensor& local, int64_t d, int64_t n,
                         const ProcessGroupPtr& group) {
  const int64_t k = group->size();
  const int64_t chunk = (n + k - 1) / k;
  at::Tensor front = to_front(padded_along(local, d, chunk), d);
  if (front.numel() == 0) {  // the same on every rank of the group: nothing to move
    std::vector<int64_t> shape = local.sizes().vec();
    shape[d] = n;
    return at::zeros(shape, local.options());
  }
  std::vector<int64_t> out_shape = front.sizes().vec();
  out_shape[0] = chunk * k;
  at::Tensor out = at::empty(out_shape, front.options());
  all_gather_into_tensor(out, front, group);
  return from_front(out.narrow(0, 0, n), d);
}

// Replicate -> Shard(d): this rank's chunk, a tensor of its own (autograd functions must not
// return views of their inputs).
at::Tensor chunk_of(const at::Tensor& replica, int64_t d, const ProcessGroupPtr& group) {
  const auto [length, offset] =
      local_shard_size_and_offset(replica.size(d), group->size(), group->rank());
  return replica.narrow(d, offset, length).clone(at::MemoryFormat::Contiguous);
}

at::Tensor reduced(const at::Tensor& partial, ReduceOp op, const ProcessGroupPtr& group) {
  at::Tensor out = partial.clone(at::MemoryFormat::Contiguous);
  all_reduce(out, op, group);
  return out;
}

// Partial -> Shard(d): a reduce-scatter of the dimension padded to whole chunks.
at::Tensor reduce_scatter_shards(const at::Tensor& partial, int64_t d, ReduceOp op,
                                 const ProcessGroupPtr& group) {
  const int64_t k = group->size();
  const int64_t n = partial.size(d);
  const int64_t chunk = (n + k - 1) / k;
  const int64_t length = local_shard_size_and_offset(n, k, group->rank()).first;
  at::Tensor front = to_front(padded_along(partial, d, chunk * k), d);
  if (front.numel() == 0) return chunk_of(partial, d, group);
  std::vector<int64_t> out_shape = front.sizes().vec();
  out_shape[0] = chunk;
  at::Tensor out = at::empty(out_shape, front.options());
  reduce_scatter_tensor(out, front, op, group);
  return from_front(out.narrow(0, 0, length), d);
}

// Shard(from) -> Shard(to) with both extents divisible by the group's size: one all-to-all.
// Chunk j of this rank's shard along `to` goes to rank j; what rank j sends back is its shard
// along `from` of this rank's chunk, so concatenating in rank order along `from` rebuilds it.
at::Tensor all_to_all_shards(const at::Tensor& local, int64_t from, int64_t to,
                             const ProcessGroupPtr& group) {
  const int64_t k = group->size();
  at::Tensor send = at::stack(local.chunk(k, to), 0).contiguous();
  at::Tensor receive = at::empty_like(send);
  if (send.numel() > 0) all_to_all_single(receive, send, {}, {}, group);
  return at::cat(receive.unbind(0), from).contiguous();
}

// One mesh dimension's change, with the mesh dimensions after it not splitting the tensor
// dimensions involved (Note [Redistribute order]).
at::Tensor change_along(const at::Tensor& t, const Placement& from, const Placement& to,
                        int64_t from_extent, const ProcessGroupPtr& group) {
  const int64_t k = group->size();
  if (is_shard(from)) {
    const int64_t d = shard_dim(from);
    if (is_shard(to) && from_extent % k == 0 && t.size(shard_dim(to)) % k == 0) {
      return all_to_all_shards(t, d, shard_dim(to), group);
    }
    return change_along(gather_shards(t, d, from_extent, group), Replicate(), to, 0, group);
  }
  if (is_replicate(from)) {
    if (is_replicate(to)) return t;
    if (is_shard(to)) return chunk_of(t, shard_dim(to), group);
    return partition_value(t, std::get<Partial>(to).reduce_op, k);
  }
  const ReduceOp op = std::get<Partial>(from).reduce_op;
  if (is_shard(to)) return reduce_scatter_shards(t, shard_dim(to), op, group);
  at::Tensor replica = reduced(t, op, group);
  if (is_replicate(to)) return replica;
  return partition_value(replica, std::get<Partial>(to).reduce_op, k);
}

}  // namespace

at::Tensor scatter_shards(const at::Tensor& t, int64_t d, const ProcessGroupPtr& group,
                          std::optional<int> src) {
  if (!src || t.numel() == 0) return chunk_of(t, d, group);
  const int64_t k = group->size();
  const int64_t n = t.size(d);
  const int64_t chunk = (n + k - 1) / k;
  std::vector<int64_t> shape = t.movedim(d, 0).sizes().vec();
  shape[0] = chunk;
  at::Tensor out = at::empty(shape, t.options());
  std::vector<at::Tensor> pieces;
  if (group->rank() == *src) {
    for (int64_t r = 0; r < k; ++r) {
      const auto [length, offset] = local_shard_size_and_offset(n, k, r);
      pieces.push_back(to_front(padded_along(t.narrow(d, offset, length), d, chunk), d));
    }
  }
  scatter(out, pieces, group->global_rank(*src), group);
  return from_front(out.narrow(0, 0, local_shard_size_and_offset(n, k, group->rank()).first), d);
}

at::Tensor partition_value(const at::Tensor& replica, ReduceOp op, int64_t size) {
  switch (op) {
    case ReduceOp::SUM:
      return replica / size;
    case ReduceOp::AVG:
    case ReduceOp::MIN:
    case ReduceOp::MAX:
      return replica.clone(at::MemoryFormat::Contiguous);
    default:
      TDIST_THROW(InvalidArgument, "tdist::tensor: Replicate to " + to_string(Partial(op)) +
                                       " is not supported: no value per rank reduces back to "
                                       "the tensor exactly (use Partial(sum), avg, min or max)");
  }
}

// Note [Redistribute order]: shards on several mesh dimensions nest left to right (the
// first mesh dimension splits the tensor, the next splits that chunk), so a mesh dimension
// can only be gathered, scattered or exchanged when no later mesh dimension splits the same
// tensor dimension. The plan therefore first gathers, right to left, every shard that is
// changing or that lies inside one that is changing, then makes every remaining change left
// to right (chunks, reduce-scatters, all-reduces, all-to-alls), so new shards nest in order.
at::Tensor redistribute_local(const at::Tensor& local, const DeviceMesh& mesh,
                              const Placements& from, const Placements& to,
                              const std::vector<int64_t>& global_shape) {
  const int n = mesh.ndim();
  Placements current = from;
  std::vector<bool> gather_first(n, false);
  for (int i = 0; i < n; ++i) {
    if (current[i] == to[i]) continue;
    std::vector<int64_t> dims;
    if (is_shard(current[i])) dims.push_back(shard_dim(current[i]));
    if (is_shard(to[i])) dims.push_back(shard_dim(to[i]));
    bool nested = false;
    for (int j = i + 1; j < n; ++j) {
      for (int64_t d : dims) {
        if (is_shard(current[j], d)) gather_first[j] = nested = true;
      }
    }
    if (is_shard(current[i]) && (!is_shard(to[i]) || nested)) gather_first[i] = true;
  }
  at::Tensor t = local;
  for (int i = n - 1; i >= 0; --i) {
    if (!gather_first[i] || !is_shard(current[i])) continue;
    const int64_t d = shard_dim(current[i]);
    t = gather_shards(t, d, level_extent(global_shape, mesh, current, d, i), mesh.get_group(i));
    current[i] = Replicate();
  }
  for (int i = 0; i < n; ++i) {
    if (current[i] == to[i]) continue;
    const int64_t extent = is_shard(current[i])
                               ? level_extent(global_shape, mesh, current, shard_dim(current[i]), i)
                               : 0;
    t = change_along(t, current[i], to[i], extent, mesh.get_group(i));
    current[i] = to[i];
  }
  return t;
}

Placements checked_placements(Placements placements, const DeviceMesh& mesh, int64_t ndim,
                              const char* what) {
  if (placements.empty()) placements.assign(mesh.ndim(), Replicate());
  TDIST_CHECK_ARG(static_cast<int>(placements.size()) == mesh.ndim(),
                  std::string(what) + ": " + std::to_string(placements.size()) + " placements " +
                      to_string(placements) + " for a " + std::to_string(mesh.ndim()) +
                      "-D mesh; give one placement per mesh dimension");
  std::optional<ReduceOp> partial_op;
  for (Placement& p : placements) {
    if (auto* s = std::get_if<Shard>(&p)) {
      TDIST_CHECK_ARG(s->dim >= -ndim && s->dim < ndim,
                      std::string(what) + ": Shard(dim=" + std::to_string(s->dim) + ") of a " +
                          std::to_string(ndim) + "-D tensor; the dim must be in [" +
                          std::to_string(-ndim) + ", " + std::to_string(ndim) + ")");
      if (s->dim < 0) s->dim += ndim;
    }
    if (auto* q = std::get_if<Partial>(&p)) {
      TDIST_CHECK_ARG(!partial_op || *partial_op == q->reduce_op,
                      std::string(what) + ": placements " + to_string(placements) +
                          " mix Partial reduce operations; a tensor is reduced one way");
      partial_op = q->reduce_op;
    }
  }
  return placements;
}

}  // namespace tdist::tensor::detail

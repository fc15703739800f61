// The collective free functions of distributed.h: argument checks, global -> group rank
// translation, the optional TDIST_DEBUG=DETAIL cross-rank check, and async_op semantics.
// The point-to-point ones are in point_to_point.cpp; the per-call steps in collective_call.h.

#include <ATen/Functions.h>

#include <numeric>

#include "comm/collective_call.h"
#include "comm/state.h"
#include "tdist/comm/distributed.h"
#include "tdist/detail/comm/placed_all_gather.h"
#include "tdist/error.h"

namespace tdist {

namespace {

using detail::Call;
using detail::real_view;
using detail::real_views;

int reduce_code(const ReduceOp& op) {
  return op.code();
}

// Note [PREMUL_SUM without NCCL]: ReduceOp PREMUL_SUM (torch.distributed's
// _make_nccl_premul_sum) reduces factor * x_r with SUM. NCCL multiplies inside its kernels
// (ncclRedOpCreatePreMulSum); every other backend (CollectiveBackend::supports_premul_sum)
// is handed SUM over inputs multiplied here first: in place where the collective overwrites
// the tensor anyway (all_reduce, reduce's root), on a copy where the caller's tensor is only
// read (reduce's other ranks keep their input, as NCCL leaves it; reduce_scatter's inputs).
// The product is taken in the tensor's dtype, as NCCL takes it; only the summation order may
// differ, as between any two backends.
bool scales_first(const CollectiveBackend& backend, const ReduceOp& op) {
  return op == ReduceOp::PREMUL_SUM && !backend.supports_premul_sum();
}

/// The op the backend gets for `op`, multiplying `t` in place when it must (see above).
ReduceOp premul_in_place(CollectiveBackend& backend, const ReduceOp& op, const at::Tensor& t) {
  if (!scales_first(backend, op)) return op;
  t.mul_(op.factor_like(t));
  return ReduceOp::SUM;
}

at::Tensor premul_copy(const ReduceOp& op, const at::Tensor& t) {
  return at::mul(t, op.factor_like(t));
}

}  // namespace

WorkPtr broadcast(const at::Tensor& tensor, std::optional<int> src, const ProcessGroupPtr& group,
                  bool async_op, std::optional<int> group_src) {
  Call c(group, "broadcast");
  const int root = c.root_of(src, group_src, "src", "group_src");
  if (c.skip()) return completed_work(c.op);
  c.check_output(tensor, "tensor");
  auto opts = c.options<BroadcastOptions>();
  opts.root = root;
  c.debug(tensor, true, opts.root);
  at::Tensor t = real_view(tensor);
  return c.finish(c.pg->backend_for(t).broadcast(t, opts), async_op);
}

WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op, const ProcessGroupPtr& group,
                   bool async_op) {
  Call c(group, "all_reduce");
  if (c.skip()) return completed_work(c.op);
  c.check_output(tensor, "tensor");
  c.check_reduce_op(tensor, op);
  auto opts = c.options<AllreduceOptions>();
  opts.op = op;
  c.debug(tensor, true, -1, reduce_code(op));
  at::Tensor t = real_view(tensor);
  CollectiveBackend& backend = c.pg->backend_for(t);
  opts.op = premul_in_place(backend, op, t);
  return c.finish(backend.all_reduce(t, opts), async_op);
}

WorkPtr all_reduce_coalesced(const std::vector<at::Tensor>& tensors, ReduceOp op,
                             const ProcessGroupPtr& group, bool async_op) {
  Call c(group, "all_reduce_coalesced");
  if (c.skip()) return completed_work(c.op);
  TDIST_CHECK_ARG(!tensors.empty(), c.where() + ": the tensor list is empty");
  for (size_t i = 0; i < tensors.size(); ++i) {
    c.check_output(tensors[i], "tensors[" + std::to_string(i) + "]");
    c.check_like(tensors[i], tensors[0], "tensors[" + std::to_string(i) + "]", false);
  }
  c.check_reduce_op(tensors[0], op);
  auto opts = c.options<AllreduceOptions>();
  opts.op = op;
  {
    // One fingerprint for the whole list: the element count of each tensor, as one shape.
    auto sig = detail::signature_of(c.op, tensors[0], true, -1, reduce_code(op));
    sig.shape.clear();
    for (const auto& t : tensors) sig.shape.push_back(t.numel());
    c.debug_signature(sig, tensors);
  }
  std::vector<at::Tensor> list = real_views(tensors);
  CollectiveBackend& backend = c.pg->backend_for(list[0]);
  for (const auto& t : list) opts.op = premul_in_place(backend, op, t);
  return c.finish(backend.all_reduce_coalesced(list, opts), async_op);
}

WorkPtr reduce(const at::Tensor& tensor, std::optional<int> dst, ReduceOp op,
               const ProcessGroupPtr& group, bool async_op, std::optional<int> group_dst) {
  Call c(group, "reduce");
  const int root = c.root_of(dst, group_dst, "dst", "group_dst");
  if (c.skip()) return completed_work(c.op);
  c.check_output(tensor, "tensor");
  auto opts = c.options<ReduceOptions>();
  opts.op = op;
  opts.root = root;
  c.check_reduce_op(tensor, op);
  c.debug(tensor, true, opts.root, reduce_code(op));
  at::Tensor t = real_view(tensor);
  CollectiveBackend& backend = c.pg->backend_for(t);
  if (scales_first(backend, op)) {
    // Only the root's tensor is written; the others keep their input (Note [PREMUL_SUM
    // without NCCL]).
    if (root == c.pg->rank()) {
      t.mul_(op.factor_like(t));
    } else {
      t = premul_copy(op, t);
    }
    opts.op = ReduceOp::SUM;
  }
  return c.finish(backend.reduce(t, opts), async_op);
}

WorkPtr all_gather(std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor,
                   const ProcessGroupPtr& group, bool async_op) {
  Call c(group, "all_gather");
  if (c.skip()) return completed_work(c.op);
  at::Tensor in = c.input(tensor, "tensor");
  c.check_list_size(tensor_list.size(), "tensor_list");
  for (size_t i = 0; i < tensor_list.size(); ++i) {
    const std::string what = "tensor_list[" + std::to_string(i) + "]";
    c.check_output(tensor_list[i], what);
    c.check_like(tensor_list[i], in, what, true);
  }
  c.debug(in);
  std::vector<at::Tensor> outputs = real_views(tensor_list);
  const at::Tensor input = real_view(in);
  return c.finish(
      c.pg->backend_for(input).all_gather(outputs, input, c.options<AllgatherOptions>()), async_op);
}

WorkPtr all_gather_into_tensor(const at::Tensor& output_tensor, const at::Tensor& input_tensor,
                               const ProcessGroupPtr& group, bool async_op) {
  Call c(group, "all_gather_into_tensor");
  if (c.skip()) return completed_work(c.op);
  at::Tensor in = c.input(input_tensor, "input_tensor");
  c.check_output(output_tensor, "output_tensor");
  c.check_like(output_tensor, in, "output_tensor", false);
  if (output_tensor.numel() != in.numel() * c.pg->size()) {
    TDIST_THROW(InvalidArgument,
                c.where() + ": output_tensor has " + std::to_string(output_tensor.numel()) +
                    " elements but must have world size (" + std::to_string(c.pg->size()) +
                    ") x input (" + std::to_string(in.numel()) + ")");
  }
  c.debug(in);
  at::Tensor out = real_view(output_tensor);
  const at::Tensor input = real_view(in);
  return c.finish(
      c.pg->backend_for(input).all_gather_into_tensor(out, input, c.options<AllgatherOptions>()),
      async_op);
}

// As c10d's Gloo allgather_coalesced, on every backend: the inputs travel as one flat
// all_gather_into_tensor, and each rank's block is copied out into its output list.
WorkPtr all_gather_coalesced(std::vector<std::vector<at::Tensor>>& output_tensor_lists,
                             const std::vector<at::Tensor>& input_tensor_list,
                             const ProcessGroupPtr& group, bool async_op) {
  Call c(group, "all_gather_coalesced");
  if (c.skip()) return completed_work(c.op);
  TDIST_CHECK_ARG(!input_tensor_list.empty(), c.where() + ": input_tensor_list is empty");
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < input_tensor_list.size(); ++i) {
    const std::string what = "input_tensor_list[" + std::to_string(i) + "]";
    inputs.push_back(c.input(input_tensor_list[i], what));
    c.check_like(inputs.back(), inputs.front(), what, false);
  }
  c.check_list_size(output_tensor_lists.size(), "output_tensor_lists");
  for (size_t r = 0; r < output_tensor_lists.size(); ++r) {
    const auto& list = output_tensor_lists[r];
    if (list.size() != inputs.size()) {
      TDIST_THROW(InvalidArgument,
                  c.where() + ": output_tensor_lists[" + std::to_string(r) + "] has " +
                      std::to_string(list.size()) + " tensors but input_tensor_list has " +
                      std::to_string(inputs.size()) + "; give every rank one output per input");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string what =
          "output_tensor_lists[" + std::to_string(r) + "][" + std::to_string(i) + "]";
      c.check_output(list[i], what);
      c.check_like(list[i], inputs[i], what, true);
    }
  }
  {
    // One fingerprint for the whole list: the element count of each input, as one shape.
    auto sig = detail::signature_of(c.op, inputs[0], true, -1, -1);
    sig.shape.clear();
    for (const auto& t : inputs) sig.shape.push_back(t.numel());
    c.debug_signature(sig, inputs);
  }
  std::vector<at::Tensor> parts;
  for (const auto& t : inputs) parts.push_back(t.reshape({-1}));
  const at::Tensor flat_in = at::cat(parts);
  const int64_t total = flat_in.numel();
  const at::Tensor flat_out = at::empty({c.pg->size() * total}, flat_in.options());
  at::Tensor wire_out = real_view(flat_out);
  const at::Tensor wire_in = real_view(flat_in);
  WorkPtr gathered = c.pg->backend_for(wire_in).all_gather_into_tensor(
      wire_out, wire_in, c.options<AllgatherOptions>());
  auto copy_out = [outputs = output_tensor_lists, flat_out, total] {
    for (size_t r = 0; r < outputs.size(); ++r) {
      int64_t offset = static_cast<int64_t>(r) * total;
      for (const auto& out : outputs[r]) {
        out.view(-1).copy_(flat_out.narrow(0, offset, out.numel()));
        offset += out.numel();
      }
    }
  };
  if (!async_op || !flat_in.is_cpu()) {
    // On a device, the copies queue on the caller's current stream after the collective
    // (wait() orders it, Note [Stream semantics] in src/nccl/nccl_backend.cpp).
    c.finish(gathered, /*async_op=*/false);
    copy_out();
    return gathered;
  }
  std::vector<at::Tensor> results;
  for (const auto& list : output_tensor_lists)
    results.insert(results.end(), list.begin(), list.end());
  auto done = std::make_shared<Work>(c.op, std::move(results));
  gathered->then([done, copy_out](Work& w) {
    if (auto error = w.exception()) return done->finish_with_error(error);
    try {
      copy_out();
    } catch (...) {
      return done->finish_with_error(std::current_exception());
    }
    done->finish();
  });
  return c.finish(done, /*async_op=*/true);
}

bool supports_all_gather_placed(const at::Tensor& input, const ProcessGroupPtr& group) {
  const ProcessGroupPtr pg = detail::resolve_group(group, "all_gather_placed");
  return pg->is_member() && pg->backend_for(input).supports_all_gather_placed();
}

// Note [Placed all-gather]: the same collective as all_gather_into_tensor on the wire, so
// it is numbered, checked (TDIST_DEBUG=DETAIL) and recorded under that name.
WorkPtr all_gather_placed(const at::Tensor& input_tensor, CollectiveBackend::BlockPlacer place,
                          const ProcessGroupPtr& group) {
  Call c(group, "all_gather_into_tensor");
  if (c.skip()) return completed_work(c.op);
  at::Tensor in = c.input(input_tensor, "input_tensor");
  TDIST_CHECK_ARG(static_cast<bool>(place), c.where() + ": no block placer given");
  CollectiveBackend& backend = c.pg->backend_for(in);
  TDIST_CHECK_ARG(backend.supports_all_gather_placed(),
                  c.where() + ": backend " + backend.name() +
                      " has no placed all-gather; use all_gather_into_tensor");
  c.debug(in);
  // The placer receives raw bytes, the same for a complex tensor and its real view.
  return c.finish(
      backend.all_gather_placed(real_view(in), std::move(place), c.options<AllgatherOptions>()),
      /*async_op=*/true);
}

WorkPtr gather(const at::Tensor& tensor, std::vector<at::Tensor> gather_list,
               std::optional<int> dst, const ProcessGroupPtr& group, bool async_op,
               std::optional<int> group_dst) {
  Call c(group, "gather");
  const int root = c.root_of(dst, group_dst, "dst", "group_dst", /*fallback=*/0);
  if (c.skip()) return completed_work(c.op);
  at::Tensor in = c.input(tensor, "tensor");
  auto opts = c.options<GatherOptions>();
  opts.root = root;
  if (opts.root == c.pg->rank()) {
    c.check_list_size(gather_list.size(), "gather_list");
    for (size_t i = 0; i < gather_list.size(); ++i) {
      const std::string what = "gather_list[" + std::to_string(i) + "]";
      c.check_output(gather_list[i], what);
      c.check_like(gather_list[i], in, what, true);
    }
  } else if (!gather_list.empty()) {
    TDIST_THROW(InvalidArgument, c.where() +
                                     ": gather_list must be empty on ranks other than the "
                                     "destination (global rank " +
                                     std::to_string(c.pg->global_rank(root)) + ")");
  }
  c.debug(in, true, opts.root);
  std::vector<at::Tensor> outputs = real_views(gather_list);
  const at::Tensor input = real_view(in);
  return c.finish(c.pg->backend_for(input).gather(outputs, input, opts), async_op);
}

WorkPtr scatter(const at::Tensor& tensor, std::vector<at::Tensor> scatter_list,
                std::optional<int> src, const ProcessGroupPtr& group, bool async_op,
                std::optional<int> group_src) {
  Call c(group, "scatter");
  const int root = c.root_of(src, group_src, "src", "group_src", /*fallback=*/0);
  if (c.skip()) return completed_work(c.op);
  c.check_output(tensor, "tensor");
  auto opts = c.options<ScatterOptions>();
  opts.root = root;
  if (opts.root == c.pg->rank()) {
    c.check_list_size(scatter_list.size(), "scatter_list");
    for (size_t i = 0; i < scatter_list.size(); ++i) {
      const std::string what = "scatter_list[" + std::to_string(i) + "]";
      scatter_list[i] = c.input(scatter_list[i], what);
      c.check_like(scatter_list[i], tensor, what, true);
    }
  } else if (!scatter_list.empty()) {
    TDIST_THROW(InvalidArgument, c.where() +
                                     ": scatter_list must be empty on ranks other than the "
                                     "source (global rank " +
                                     std::to_string(c.pg->global_rank(root)) + ")");
  }
  c.debug(tensor, true, opts.root);
  at::Tensor out = real_view(tensor);
  return c.finish(c.pg->backend_for(out).scatter(out, real_views(scatter_list), opts), async_op);
}

WorkPtr reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& input_list,
                       ReduceOp op, const ProcessGroupPtr& group, bool async_op) {
  Call c(group, "reduce_scatter");
  if (c.skip()) return completed_work(c.op);
  c.check_output(output, "output");
  c.check_list_size(input_list.size(), "input_list");
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < input_list.size(); ++i) {
    const std::string what = "input_list[" + std::to_string(i) + "]";
    inputs.push_back(c.input(input_list[i], what));
    c.check_like(inputs.back(), output, what, true);
  }
  c.check_reduce_op(output, op);
  auto opts = c.options<ReduceScatterOptions>();
  opts.op = op;
  c.debug(output, true, -1, reduce_code(op));
  at::Tensor out = real_view(output);
  CollectiveBackend& backend = c.pg->backend_for(out);
  std::vector<at::Tensor> wire = real_views(inputs);
  if (scales_first(backend, op)) {
    for (auto& t : wire) t = premul_copy(op, t);
    opts.op = ReduceOp::SUM;
  }
  return c.finish(backend.reduce_scatter(out, wire, opts), async_op);
}

WorkPtr reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                              const ProcessGroupPtr& group, bool async_op) {
  Call c(group, "reduce_scatter_tensor");
  if (c.skip()) return completed_work(c.op);
  c.check_output(output, "output");
  at::Tensor in = c.input(input, "input");
  c.check_like(in, output, "input", false);
  if (in.numel() != output.numel() * c.pg->size()) {
    TDIST_THROW(InvalidArgument, c.where() + ": input has " + std::to_string(in.numel()) +
                                     " elements but must have world size (" +
                                     std::to_string(c.pg->size()) + ") x output (" +
                                     std::to_string(output.numel()) + ")");
  }
  c.check_reduce_op(output, op);
  auto opts = c.options<ReduceScatterOptions>();
  opts.op = op;
  c.debug(output, true, -1, reduce_code(op));
  at::Tensor out = real_view(output);
  CollectiveBackend& backend = c.pg->backend_for(out);
  at::Tensor wire = real_view(in);
  if (scales_first(backend, op)) {
    wire = premul_copy(op, wire);
    opts.op = ReduceOp::SUM;
  }
  return c.finish(backend.reduce_scatter_tensor(out, wire, opts), async_op);
}

WorkPtr all_to_all(std::vector<at::Tensor>& output_tensor_list,
                   const std::vector<at::Tensor>& input_tensor_list, const ProcessGroupPtr& group,
                   bool async_op) {
  Call c(group, "all_to_all");
  if (c.skip()) return completed_work(c.op);
  c.check_list_size(output_tensor_list.size(), "output_tensor_list");
  c.check_list_size(input_tensor_list.size(), "input_tensor_list");
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < input_tensor_list.size(); ++i) {
    inputs.push_back(c.input(input_tensor_list[i], "input_tensor_list[" + std::to_string(i) + "]"));
    c.check_like(inputs.back(), inputs[0], "input_tensor_list[" + std::to_string(i) + "]", false);
  }
  for (size_t i = 0; i < output_tensor_list.size(); ++i) {
    const std::string what = "output_tensor_list[" + std::to_string(i) + "]";
    c.check_output(output_tensor_list[i], what);
    c.check_like(output_tensor_list[i], inputs[0], what, false);
  }
  c.debug(inputs[0], false);
  std::vector<at::Tensor> outputs = real_views(output_tensor_list);
  return c.finish(c.pg->backend_for(inputs[0]).all_to_all(outputs, real_views(inputs),
                                                          c.options<AllToAllOptions>()),
                  async_op);
}

WorkPtr all_to_all_single(const at::Tensor& output, const at::Tensor& input,
                          const std::vector<int64_t>& output_split_sizes,
                          const std::vector<int64_t>& input_split_sizes,
                          const ProcessGroupPtr& group, bool async_op) {
  Call c(group, "all_to_all_single");
  if (c.skip()) return completed_work(c.op);
  c.check_output(output, "output");
  at::Tensor in = c.input(input, "input");
  c.check_like(output, in, "output", false);
  auto check_splits = [&](const std::vector<int64_t>& splits, const at::Tensor& t,
                          const std::string& what) {
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    if (splits.empty()) {
      if (rows % c.pg->size() != 0) {
        TDIST_THROW(InvalidArgument, c.where() + ": " + what + " has " + std::to_string(rows) +
                                         " rows, not divisible by the group size " +
                                         std::to_string(c.pg->size()) + "; give split sizes");
      }
      return;
    }
    c.check_list_size(splits.size(), what + "_split_sizes");
    int64_t sum = 0;
    for (int64_t s : splits) {
      TDIST_CHECK_ARG(s >= 0, c.where() + ": " + what + "_split_sizes has a negative entry");
      sum += s;
    }
    if (sum != rows) {
      TDIST_THROW(InvalidArgument, c.where() + ": " + what + "_split_sizes sum to " +
                                       std::to_string(sum) + " but " + what + " has " +
                                       std::to_string(rows) + " rows along dim 0");
    }
  };
  check_splits(output_split_sizes, output, "output");
  check_splits(input_split_sizes, in, "input");
  c.debug(in, false);
  at::Tensor wire_out = real_view(output);
  const at::Tensor wire_in = real_view(in);
  return c.finish(
      c.pg->backend_for(wire_in).all_to_all_single(wire_out, wire_in, output_split_sizes,
                                                   input_split_sizes, c.options<AllToAllOptions>()),
      async_op);
}

WorkPtr barrier(const ProcessGroupPtr& group, bool async_op) {
  Call c(group, "barrier");
  if (c.skip()) return completed_work(c.op);
  c.debug(at::Tensor(), false);
  return c.finish(c.pg->default_backend().barrier(c.options<BarrierOptions>()), async_op);
}

}  // namespace tdist

// The collective free functions of distributed.h: argument checks, global -> group rank
// translation, the optional TDIST_DEBUG=DETAIL cross-rank check, and async_op semantics.

#include <numeric>

#include "comm/flight_recorder_hooks.h"
#include "debug_check.h"
#include "state.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/placed_all_gather.h"
#include "tdist/error.h"

namespace tdist {

namespace {

/// Per-call context: the resolved group and the op name used in every message.
struct Call {
  ProcessGroupPtr pg;
  std::string op;
  mutable uint64_t record_id = 0;  // the flight recorder's record of this call (0: none)

  Call(const ProcessGroupPtr& group, std::string op_name)
      : pg(detail::resolve_group(group, op_name)), op(std::move(op_name)) {}

  /// torch.distributed semantics: a non-member's collective is a no-op.
  bool skip() const { return !pg->is_member(); }

  std::string where() const {
    return "rank " + std::to_string(pg->global_rank(pg->rank())) + ": " + op;
  }

  void check_defined(const at::Tensor& t, const std::string& what) const {
    if (!t.defined()) TDIST_THROW(InvalidArgument, where() + ": " + what + " is undefined");
  }
  /// Tensors the collective writes must be contiguous and need no lazy conjugation: a copy
  /// would not reach the caller.
  void check_output(const at::Tensor& t, const std::string& what) const {
    check_defined(t, what);
    if (!t.is_contiguous()) {
      TDIST_THROW(InvalidArgument, where() + ": " + what +
                                       " is not contiguous; pass a contiguous tensor "
                                       "(e.g. t.contiguous()) and copy the result back");
    }
    if (t.is_conj()) {
      TDIST_THROW(InvalidArgument, where() + ": " + what +
                                       " is a lazily conjugated view (t.conj()); pass "
                                       "t.resolve_conj() and copy the result back");
    }
  }
  /// Read-only tensors are made contiguous (and lazy conjugates resolved) silently.
  at::Tensor input(const at::Tensor& t, const std::string& what) const {
    check_defined(t, what);
    return (t.is_contiguous() ? t : t.contiguous()).resolve_conj();
  }
  /// See Note [Complex tensors].
  void check_reduce_op(const at::Tensor& t, ReduceOp op) const {
    if (t.is_complex() && op != ReduceOp::SUM && op != ReduceOp::AVG) {
      TDIST_THROW(InvalidArgument, where() + ": " + to_string(op) +
                                       " is not defined on complex numbers (dtype " +
                                       std::string(c10::toString(t.scalar_type())) +
                                       "); use SUM or AVG, or reduce a real tensor such "
                                       "as t.abs() or at::view_as_real(t)");
    }
  }
  void check_like(const at::Tensor& t, const at::Tensor& ref, const std::string& what,
                  bool same_numel) const {
    if (t.scalar_type() != ref.scalar_type()) {
      TDIST_THROW(InvalidArgument, where() + ": " + what + " has dtype " +
                                       std::string(c10::toString(t.scalar_type())) +
                                       " but the input has " +
                                       std::string(c10::toString(ref.scalar_type())) +
                                       "; every tensor of one collective needs the same dtype");
    }
    if (t.device() != ref.device()) {
      TDIST_THROW(InvalidArgument, where() + ": " + what + " is on " + t.device().str() +
                                       " but the input is on " + ref.device().str());
    }
    if (same_numel && t.numel() != ref.numel()) {
      TDIST_THROW(InvalidArgument, where() + ": " + what + " has " + std::to_string(t.numel()) +
                                       " elements but the input has " +
                                       std::to_string(ref.numel()));
    }
  }
  void check_list_size(size_t n, const std::string& what) const {
    if (static_cast<int>(n) != pg->size()) {
      TDIST_THROW(InvalidArgument, where() + ": " + what + " has " + std::to_string(n) +
                                       " tensors but the group has " + std::to_string(pg->size()) +
                                       " ranks; give one per rank");
    }
  }
  int group_rank_of(int global_rank, const std::string& what) const {
    try {
      return pg->group_rank(global_rank);
    } catch (const InvalidArgument& e) {
      TDIST_THROW(InvalidArgument, where() + ": " + what + " " + e.what());
    }
  }

  template <typename Options>
  Options options() const {
    Options opts;
    opts.timeout = pg->timeout();
    return opts;
  }

  void debug(const at::Tensor& t, bool check_shape = true, int root = -1,
             int reduce_op = -1) const {
    debug_signature(detail::signature_of(op, t, check_shape, root, reduce_op), {t});
  }
  /// Numbers the call, checks it across ranks (debug mode) and records it.
  void debug_signature(const detail::CallSignature& sig,
                       const std::vector<at::Tensor>& tensors) const {
    const uint64_t seq = pg->next_sequence_number();
    if (pg->debug_detail()) detail::check_call_signature(*pg, sig);
    record_id = detail::flight_record_issue(*pg, seq, op, tensors);
  }

  WorkPtr finish(WorkPtr work, bool async_op) const {
    if (!work) TDIST_THROW(DistBackendError, where() + ": the backend returned no work handle");
    detail::flight_record_track(record_id, pg, work);
    if (async_op) return work;
    // The backend enforces the group timeout itself; this outer bound only guarantees that a
    // misbehaving backend cannot block forever.
    auto bound = pg->timeout() + std::chrono::seconds(5);
    try {
      work->wait(bound);
    } catch (const TimeoutError& e) {
      // The flight recorder's report names the rank that is behind (see flight_recorder.h).
      const std::string report =
          detail::flight_record_failure(record_id, *pg, std::current_exception());
      TDIST_THROW(TimeoutError, where() + " on process group '" + pg->name() +
                                    "' (sequence number " + std::to_string(pg->sequence_number()) +
                                    ") did not complete: " + e.what() +
                                    (report.empty() ? "" : "\n" + report));
    } catch (const Error&) {
      detail::flight_record_failure(record_id, *pg, std::current_exception());
      throw;
    }
    return work;
  }
};

int reduce_code(ReduceOp op) {
  return static_cast<int>(op);
}

// Note [Complex tensors]: as in torch.distributed, a complex tensor travels as its real view
// (at::view_as_real: the same memory as [..., 2] of the real dtype), so every backend carries
// it without knowing complex dtypes. The sum and the average of complex numbers are those of
// their real and imaginary parts; MIN, MAX, PRODUCT and the bitwise ops are not, so they are
// refused (Call::check_reduce_op) rather than computed part by part. torch.distributed views
// complex tensors as real in most collectives but not in reduce, gather or reduce-scatter,
// which then fail in the backend; here every collective takes them. The cross-rank check and
// the flight recorder see the caller's complex tensors; only the backend sees the views.
at::Tensor real_view(const at::Tensor& t) {
  return t.is_complex() ? at::view_as_real(t) : t;
}

std::vector<at::Tensor> real_views(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> views;
  views.reserve(tensors.size());
  for (const auto& t : tensors) views.push_back(real_view(t));
  return views;
}

}  // namespace

WorkPtr broadcast(const at::Tensor& tensor, int src, const ProcessGroupPtr& group, bool async_op) {
  Call c(group, "broadcast");
  if (c.skip()) return completed_work(c.op);
  c.check_output(tensor, "tensor");
  auto opts = c.options<BroadcastOptions>();
  opts.root = c.group_rank_of(src, "src");
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
  return c.finish(c.pg->backend_for(t).all_reduce(t, opts), async_op);
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
  return c.finish(c.pg->backend_for(list[0]).all_reduce_coalesced(list, opts), async_op);
}

WorkPtr reduce(const at::Tensor& tensor, int dst, ReduceOp op, const ProcessGroupPtr& group,
               bool async_op) {
  Call c(group, "reduce");
  if (c.skip()) return completed_work(c.op);
  c.check_output(tensor, "tensor");
  auto opts = c.options<ReduceOptions>();
  opts.op = op;
  opts.root = c.group_rank_of(dst, "dst");
  c.check_reduce_op(tensor, op);
  c.debug(tensor, true, opts.root, reduce_code(op));
  at::Tensor t = real_view(tensor);
  return c.finish(c.pg->backend_for(t).reduce(t, opts), async_op);
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

WorkPtr gather(const at::Tensor& tensor, std::vector<at::Tensor> gather_list, int dst,
               const ProcessGroupPtr& group, bool async_op) {
  Call c(group, "gather");
  if (c.skip()) return completed_work(c.op);
  at::Tensor in = c.input(tensor, "tensor");
  auto opts = c.options<GatherOptions>();
  opts.root = c.group_rank_of(dst, "dst");
  if (opts.root == c.pg->rank()) {
    c.check_list_size(gather_list.size(), "gather_list");
    for (size_t i = 0; i < gather_list.size(); ++i) {
      const std::string what = "gather_list[" + std::to_string(i) + "]";
      c.check_output(gather_list[i], what);
      c.check_like(gather_list[i], in, what, true);
    }
  } else if (!gather_list.empty()) {
    TDIST_THROW(InvalidArgument, c.where() +
                                     ": gather_list must be empty on ranks other than "
                                     "dst " +
                                     std::to_string(dst));
  }
  c.debug(in, true, opts.root);
  std::vector<at::Tensor> outputs = real_views(gather_list);
  const at::Tensor input = real_view(in);
  return c.finish(c.pg->backend_for(input).gather(outputs, input, opts), async_op);
}

WorkPtr scatter(const at::Tensor& tensor, std::vector<at::Tensor> scatter_list, int src,
                const ProcessGroupPtr& group, bool async_op) {
  Call c(group, "scatter");
  if (c.skip()) return completed_work(c.op);
  c.check_output(tensor, "tensor");
  auto opts = c.options<ScatterOptions>();
  opts.root = c.group_rank_of(src, "src");
  if (opts.root == c.pg->rank()) {
    c.check_list_size(scatter_list.size(), "scatter_list");
    for (size_t i = 0; i < scatter_list.size(); ++i) {
      const std::string what = "scatter_list[" + std::to_string(i) + "]";
      scatter_list[i] = c.input(scatter_list[i], what);
      c.check_like(scatter_list[i], tensor, what, true);
    }
  } else if (!scatter_list.empty()) {
    TDIST_THROW(InvalidArgument, c.where() +
                                     ": scatter_list must be empty on ranks other than "
                                     "src " +
                                     std::to_string(src));
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
  return c.finish(c.pg->backend_for(out).reduce_scatter(out, real_views(inputs), opts), async_op);
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
  return c.finish(c.pg->backend_for(out).reduce_scatter_tensor(out, real_view(in), opts), async_op);
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

namespace {
WorkPtr point_to_point(bool is_send, const at::Tensor& tensor, int peer,
                       const ProcessGroupPtr& group, int tag) {
  Call c(group, is_send ? "send" : "recv");
  if (c.skip()) return completed_work(c.op);
  const char* role = is_send ? "dst" : "src";
  int peer_rank = c.group_rank_of(peer, role);
  if (peer_rank == c.pg->rank()) {
    TDIST_THROW(InvalidArgument, c.where() + ": " + role + " " + std::to_string(peer) +
                                     " is this rank itself; a rank cannot " + c.op +
                                     " to or from itself");
  }
  TDIST_CHECK_ARG(tag >= 0, c.where() + ": tag " + std::to_string(tag) + " is negative");
  auto opts = c.options<SendRecvOptions>();
  opts.tag_id = tag;
  WorkPtr work;
  at::Tensor t = is_send ? c.input(tensor, "tensor") : tensor;
  if (!is_send) c.check_output(tensor, "tensor");
  const uint64_t record_id =
      detail::flight_record_issue(*c.pg, c.pg->sequence_number(), c.op, {t}, peer);
  at::Tensor wire = real_view(t);
  work = is_send ? c.pg->backend_for(wire).send(wire, peer_rank, opts)
                 : c.pg->backend_for(wire).recv(wire, peer_rank, opts);
  detail::flight_record_track(record_id, c.pg, work);
  return work;
}
}  // namespace

P2POp::P2POp(Function op_, at::Tensor tensor_, int peer_, ProcessGroupPtr group_, int tag_)
    : op(op_), tensor(std::move(tensor_)), peer(peer_), group(std::move(group_)), tag(tag_) {
  TDIST_CHECK_ARG(op == &isend || op == &irecv, "P2POp: op must be tdist::isend or tdist::irecv");
}

std::vector<WorkPtr> batch_isend_irecv(const std::vector<P2POp>& ops) {
  TDIST_CHECK_ARG(!ops.empty(), "batch_isend_irecv: the list of ops is empty");
  for (const auto& op : ops) {
    TDIST_CHECK_ARG(op.group == ops.front().group,
                    "batch_isend_irecv: every P2POp must use the same group");
  }
  Call c(ops.front().group, "batch_isend_irecv");
  if (c.skip()) return std::vector<WorkPtr>(ops.size(), completed_work(c.op));
  std::vector<PointToPoint> batch;
  std::vector<at::Tensor> tensors;
  for (const auto& op : ops) {
    const bool is_send = op.op == &isend;
    const char* role = is_send ? "dst" : "src";
    PointToPoint p;
    p.is_send = is_send;
    p.peer = c.group_rank_of(op.peer, role);
    if (p.peer == c.pg->rank()) {
      TDIST_THROW(InvalidArgument,
                  c.where() + ": " + role + " " + std::to_string(op.peer) + " is this rank itself");
    }
    TDIST_CHECK_ARG(op.tag >= 0, c.where() + ": tag " + std::to_string(op.tag) + " is negative");
    p.tag = op.tag;
    p.tensor = is_send ? c.input(op.tensor, "tensor") : op.tensor;
    if (!is_send) c.check_output(op.tensor, "tensor");
    if (!batch.empty() && p.tensor.device() != batch.front().tensor.device()) {
      TDIST_THROW(InvalidArgument, c.where() + ": a tensor on " + p.tensor.device().str() +
                                       " and one on " + batch.front().tensor.device().str() +
                                       "; one batch goes to one backend and device");
    }
    tensors.push_back(p.tensor);
    p.tensor = real_view(p.tensor);
    batch.push_back(std::move(p));
  }
  const uint64_t record_id =
      detail::flight_record_issue(*c.pg, c.pg->sequence_number(), c.op, tensors);
  WorkPtr work = c.pg->backend_for(batch.front().tensor)
                     .batch_send_recv(batch, c.options<CollectiveOptions>());
  detail::flight_record_track(record_id, c.pg, work);
  return std::vector<WorkPtr>(ops.size(), work);
}

WorkPtr isend(const at::Tensor& tensor, int dst, const ProcessGroupPtr& group, int tag) {
  return point_to_point(true, tensor, dst, group, tag);
}

WorkPtr irecv(const at::Tensor& tensor, int src, const ProcessGroupPtr& group, int tag) {
  return point_to_point(false, tensor, src, group, tag);
}

void send(const at::Tensor& tensor, int dst, const ProcessGroupPtr& group, int tag) {
  auto work = isend(tensor, dst, group, tag);
  auto pg = detail::resolve_group(group, "send");
  work->wait(pg->timeout() + std::chrono::seconds(5));
}

int recv(const at::Tensor& tensor, int src, const ProcessGroupPtr& group, int tag) {
  auto work = irecv(tensor, src, group, tag);
  auto pg = detail::resolve_group(group, "recv");
  work->wait(pg->timeout() + std::chrono::seconds(5));
  return src;
}

}  // namespace tdist

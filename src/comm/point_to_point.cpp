// The point-to-point free functions of distributed.h: send, recv (from a named or any
// source), isend, irecv and batch_isend_irecv, with torch.distributed's dst/src or
// group_dst/group_src forms.

#include "comm/collective_call.h"
#include "comm/flight_recorder_hooks.h"
#include "comm/state.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist {

namespace {

using detail::Call;
using detail::real_view;

void check_tag(const Call& c, int tag) {
  TDIST_CHECK_ARG(tag >= 0, c.where() + ": tag " + std::to_string(tag) + " is negative");
}

void check_not_self(const Call& c, int peer_rank, const char* role) {
  if (peer_rank != c.pg->rank()) return;
  TDIST_THROW(InvalidArgument, c.where() + ": " + role + " (global rank " +
                                   std::to_string(c.pg->global_rank(peer_rank)) +
                                   ") is this rank itself; a rank cannot " + c.op +
                                   " to or from itself");
}

WorkPtr issue_send(const at::Tensor& tensor, std::optional<int> dst, const ProcessGroupPtr& group,
                   int tag, std::optional<int> group_dst) {
  Call c(group, "send");
  const int peer = c.root_of(dst, group_dst, "dst", "group_dst");
  if (c.skip()) return completed_work(c.op);
  check_not_self(c, peer, "dst");
  check_tag(c, tag);
  auto opts = c.options<SendRecvOptions>();
  opts.tag_id = tag;
  const at::Tensor t = c.input(tensor, "tensor");
  const uint64_t record_id = detail::flight_record_issue(*c.pg, c.pg->sequence_number(), c.op, {t},
                                                         c.pg->global_rank(peer));
  const at::Tensor wire = real_view(t);
  WorkPtr work = c.pg->backend_for(wire).send(wire, peer, opts);
  detail::flight_record_track(record_id, c.pg, work);
  return work;
}

WorkPtr issue_recv(const at::Tensor& tensor, std::optional<int> src, const ProcessGroupPtr& group,
                   int tag, std::optional<int> group_src) {
  Call c(group, "recv");
  // Neither src nor group_src: a receive from any source (c10d's recvAnysource).
  const bool any_source = !src && !group_src;
  const int peer = any_source ? -1 : c.root_of(src, group_src, "src", "group_src");
  if (c.skip()) return completed_work(c.op);
  if (!any_source) check_not_self(c, peer, "src");
  check_tag(c, tag);
  c.check_output(tensor, "tensor");
  if (any_source && c.pg->size() == 1) {
    TDIST_THROW(InvalidArgument, c.where() +
                                     ": a receive from any source in a group of one "
                                     "rank would wait forever: no other rank can "
                                     "send");
  }
  auto opts = c.options<SendRecvOptions>();
  opts.tag_id = tag;
  const uint64_t record_id =
      detail::flight_record_issue(*c.pg, c.pg->sequence_number(), c.op, {tensor},
                                  any_source ? kAnyPeer : c.pg->global_rank(peer));
  at::Tensor wire = real_view(tensor);
  CollectiveBackend& backend = c.pg->backend_for(wire);
  WorkPtr work = any_source ? backend.recv_anysource(wire, opts) : backend.recv(wire, peer, opts);
  if (!work) TDIST_THROW(DistBackendError, c.where() + ": the backend returned no work handle");
  if (!any_source) work->set_source_rank(peer);
  detail::flight_record_track(record_id, c.pg, work);
  return work;
}

/// Waits for a blocking send or recv, bounded as Call::finish bounds collectives.
void wait_for(const WorkPtr& work, const ProcessGroupPtr& group, const char* op) {
  const auto pg = detail::resolve_group(group, op);
  work->wait(pg->timeout() + std::chrono::seconds(5));
}

}  // namespace

P2POp::P2POp(Function op_, at::Tensor tensor_, std::optional<int> peer_, ProcessGroupPtr group_,
             int tag_, std::optional<int> group_peer_)
    : op(op_), tensor(std::move(tensor_)), tag(tag_) {
  TDIST_CHECK_ARG(op == &isend || op == &irecv, "P2POp: op must be tdist::isend or tdist::irecv");
  TDIST_CHECK_ARG(tensor.defined(), "P2POp: the tensor is undefined");
  // As torch.distributed.P2POp: the group resolved, and the peer held in both forms.
  group = detail::resolve_group(group_, "P2POp");
  group_peer = Call(group, "P2POp").root_of(peer_, group_peer_, "peer", "group_peer");
  if (group_peer < 0) group_peer = peer_ ? group->group_rank(*peer_) : *group_peer_;  // non-member
  peer = group->global_rank(group_peer);
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
    p.peer = op.group_peer;
    check_not_self(c, p.peer, role);
    check_tag(c, op.tag);
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

WorkPtr isend(const at::Tensor& tensor, std::optional<int> dst, const ProcessGroupPtr& group,
              int tag, std::optional<int> group_dst) {
  return issue_send(tensor, dst, group, tag, group_dst);
}

WorkPtr irecv(const at::Tensor& tensor, std::optional<int> src, const ProcessGroupPtr& group,
              int tag, std::optional<int> group_src) {
  return issue_recv(tensor, src, group, tag, group_src);
}

void send(const at::Tensor& tensor, std::optional<int> dst, const ProcessGroupPtr& group, int tag,
          std::optional<int> group_dst) {
  wait_for(issue_send(tensor, dst, group, tag, group_dst), group, "send");
}

int recv(const at::Tensor& tensor, std::optional<int> src, const ProcessGroupPtr& group, int tag,
         std::optional<int> group_src) {
  const WorkPtr work = issue_recv(tensor, src, group, tag, group_src);
  const auto pg = detail::resolve_group(group, "recv");
  if (!pg->is_member()) return -1;
  wait_for(work, group, "recv");
  const int from = work->source_rank();
  if (from < 0) {
    TDIST_THROW(DistBackendError, "recv: backend '" + get_backend(pg) +
                                      "' completed a receive without naming its sender");
  }
  return pg->global_rank(from);
}

}  // namespace tdist

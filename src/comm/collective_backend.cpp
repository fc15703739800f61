#include "tdist/comm/collective_backend.h"

#include <atomic>

#include "tdist/error.h"

namespace tdist {

void CollectiveBackend::throw_unsupported(const std::string& op) const {
  TDIST_THROW(DistBackendError, "backend '" + name() + "' does not support " + op +
                                    "; use a backend that does (see the support table in "
                                    "README) or register one with Backend::register_backend");
}

bool CollectiveBackend::abort(const std::string& reason) {
  mark_broken(reason);
  return false;
}

void CollectiveBackend::mark_broken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(broken_mutex_);
  if (broken_reason_.empty()) broken_reason_ = reason;
}

bool CollectiveBackend::is_broken() const {
  std::lock_guard<std::mutex> lock(broken_mutex_);
  return !broken_reason_.empty();
}

std::string CollectiveBackend::broken_reason() const {
  std::lock_guard<std::mutex> lock(broken_mutex_);
  return broken_reason_;
}

void CollectiveBackend::check_not_broken(const std::string& op) const {
  auto reason = broken_reason();
  if (!reason.empty()) {
    TDIST_THROW(DistBackendError, "rank " + std::to_string(rank_) + ": " + op + " refused: the " +
                                      name() +
                                      " process group is broken after an earlier failure (" +
                                      reason + "); destroy it and re-initialise");
  }
}

WorkPtr CollectiveBackend::broadcast(at::Tensor&, const BroadcastOptions&) {
  throw_unsupported("broadcast");
}
WorkPtr CollectiveBackend::all_reduce(at::Tensor&, const AllreduceOptions&) {
  throw_unsupported("all_reduce");
}
WorkPtr CollectiveBackend::all_reduce_coalesced(std::vector<at::Tensor>&, const AllreduceOptions&) {
  throw_unsupported("all_reduce_coalesced");
}
WorkPtr CollectiveBackend::reduce(at::Tensor&, const ReduceOptions&) {
  throw_unsupported("reduce");
}
WorkPtr CollectiveBackend::all_gather(std::vector<at::Tensor>&, const at::Tensor&,
                                      const AllgatherOptions&) {
  throw_unsupported("all_gather");
}
WorkPtr CollectiveBackend::all_gather_into_tensor(at::Tensor&, const at::Tensor&,
                                                  const AllgatherOptions&) {
  throw_unsupported("all_gather_into_tensor");
}
WorkPtr CollectiveBackend::all_gather_placed(const at::Tensor&, BlockPlacer,
                                             const AllgatherOptions&) {
  throw_unsupported("all_gather_placed");
}
WorkPtr CollectiveBackend::gather(std::vector<at::Tensor>&, const at::Tensor&,
                                  const GatherOptions&) {
  throw_unsupported("gather");
}
WorkPtr CollectiveBackend::scatter(at::Tensor&, const std::vector<at::Tensor>&,
                                   const ScatterOptions&) {
  throw_unsupported("scatter");
}
WorkPtr CollectiveBackend::reduce_scatter(at::Tensor&, const std::vector<at::Tensor>&,
                                          const ReduceScatterOptions&) {
  throw_unsupported("reduce_scatter");
}
WorkPtr CollectiveBackend::reduce_scatter_tensor(at::Tensor&, const at::Tensor&,
                                                 const ReduceScatterOptions&) {
  throw_unsupported("reduce_scatter_tensor");
}
WorkPtr CollectiveBackend::all_to_all(std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                                      const AllToAllOptions&) {
  throw_unsupported("all_to_all");
}
WorkPtr CollectiveBackend::all_to_all_single(at::Tensor&, const at::Tensor&,
                                             const std::vector<int64_t>&,
                                             const std::vector<int64_t>&, const AllToAllOptions&) {
  throw_unsupported("all_to_all_single");
}
WorkPtr CollectiveBackend::barrier(const BarrierOptions&) {
  throw_unsupported("barrier");
}
WorkPtr CollectiveBackend::send(const at::Tensor&, int, const SendRecvOptions&) {
  throw_unsupported("send");
}
WorkPtr CollectiveBackend::recv(at::Tensor&, int, const SendRecvOptions&) {
  throw_unsupported("recv");
}

WorkPtr CollectiveBackend::recv_anysource(at::Tensor&, const SendRecvOptions&) {
  throw_unsupported("recv from any source (src and group_src both unset)");
}

CollectiveBackendPtr CollectiveBackend::split(const std::vector<int>&, int,
                                              std::chrono::milliseconds, const std::any&) {
  throw_unsupported("split (ncclCommSplit)");
}

CollectiveBackendPtr CollectiveBackend::shrink(const std::vector<int>&, int,
                                               std::chrono::milliseconds, const std::any&) {
  throw_unsupported("shrink (ncclCommShrink)");
}

WorkPtr CollectiveBackend::batch_send_recv(std::vector<PointToPoint>& ops,
                                           const CollectiveOptions& opts) {
  std::vector<at::Tensor> received;
  std::vector<WorkPtr> works;
  for (auto& op : ops) {
    SendRecvOptions one;
    one.timeout = opts.timeout;
    one.tag = opts.tag;
    one.tag_id = op.tag;
    if (op.is_send) {
      works.push_back(send(op.tensor, op.peer, one));
    } else {
      works.push_back(recv(op.tensor, op.peer, one));
      received.push_back(op.tensor);
    }
  }
  // One Work for the batch: done when every part is, failed with the first part's error.
  auto batch = std::make_shared<Work>("batch_isend_irecv", received);
  auto left = std::make_shared<std::atomic<size_t>>(works.size());
  if (works.empty()) batch->finish();
  for (auto& w : works) {
    w->then([batch, left](Work& part) {
      if (auto error = part.exception()) batch->finish_with_error(error);
      if (left->fetch_sub(1) == 1) batch->finish();
    });
  }
  return batch;
}

}  // namespace tdist

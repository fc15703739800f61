// Pairwise exchanges: all_to_all (+ single, with split sizes), barrier, send and recv.

#include <cstring>
#include <numeric>

#include "gloo/collective_common.h"
#include "gloo/shm_collectives.h"
#include "tdist/gloo/gloo_backend.h"

namespace tdist::gloo {

using namespace tdist::detail;

namespace {

// Posts every peer's transfer of an all-to-all, copies our own block, waits.
void exchange_blocks(Exchange& ex, const std::vector<const char*>& send_ptr,
                     const std::vector<int64_t>& send_bytes, const std::vector<char*>& recv_ptr,
                     const std::vector<int64_t>& recv_bytes) {
  const int n = ex.size();
  const int r = ex.rank();
  for (int i = 1; i < n; ++i) {
    const int p = (r - i + n) % n;  // staggered so that no peer gets everyone's first segment
    ex.recv_segmented(p, recv_ptr[p], recv_bytes[p], from_rank(p));
  }
  for (int i = 1; i < n; ++i) {
    const int p = (r + i) % n;
    ex.send_segmented(p, send_ptr[p], send_bytes[p], from_rank(r));
  }
  if (send_bytes[r] > 0) std::memcpy(recv_ptr[r], send_ptr[r], send_bytes[r]);
  ex.wait_all();
}

std::vector<int64_t> splits_or_even(const std::vector<int64_t>& splits, int64_t rows, int n,
                                    int rank, const std::string& op, const std::string& name) {
  if (splits.empty()) {
    TDIST_CHECK_ARG(rows % n == 0, rank_prefix(rank, op) + name + " dim 0 (" +
                                       std::to_string(rows) + ") is not divisible by world size " +
                                       std::to_string(n) + "; pass " + name + "_split_sizes");
    return std::vector<int64_t>(n, rows / n);
  }
  TDIST_CHECK_ARG(static_cast<int>(splits.size()) == n,
                  rank_prefix(rank, op) + name + "_split_sizes has " +
                      std::to_string(splits.size()) + " entries but the world size is " +
                      std::to_string(n));
  int64_t sum = 0;
  for (auto s : splits) {
    TDIST_CHECK_ARG(s >= 0, rank_prefix(rank, op) + name + "_split_sizes has a negative entry");
    sum += s;
  }
  TDIST_CHECK_ARG(sum == rows, rank_prefix(rank, op) + name + "_split_sizes sum to " +
                                   std::to_string(sum) + " but " + name + " has " +
                                   std::to_string(rows) + " rows along dim 0");
  return splits;
}

}  // namespace

WorkPtr GlooBackend::all_to_all_single(at::Tensor& output, const at::Tensor& input,
                                       const std::vector<int64_t>& output_split_sizes,
                                       const std::vector<int64_t>& input_split_sizes,
                                       const AllToAllOptions& opts) {
  const std::string op = "all_to_all_single";
  check_tensor(output, op, rank_, "output");
  check_tensor(input, op, rank_, "input");
  check_same_dtype(input, output, op, rank_, "input and output");
  TDIST_CHECK_ARG(input.dim() >= 1 && output.dim() >= 1,
                  rank_prefix(rank_, op) + "input and output need at least one dimension");
  const int64_t in_row = input.size(0) ? input.numel() / input.size(0) : 0;
  const int64_t out_row = output.size(0) ? output.numel() / output.size(0) : 0;
  TDIST_CHECK_ARG(input.size(0) == 0 || output.size(0) == 0 || in_row == out_row,
                  rank_prefix(rank_, op) + "input rows have " + std::to_string(in_row) +
                      " elements but output rows have " + std::to_string(out_row));
  auto in_splits = splits_or_even(input_split_sizes, input.size(0), size_, rank_, op, "input");
  auto out_splits = splits_or_even(output_split_sizes, output.size(0), size_, rank_, op, "output");
  const int64_t row_bytes = std::max(in_row, out_row) * input.element_size();
  std::vector<int64_t> send(size_), recv(size_);
  for (int p = 0; p < size_; ++p) {
    send[p] = in_splits[p] * row_bytes;
    recv[p] = out_splits[p] * row_bytes;
  }
  TDIST_CHECK_ARG(send[rank_] == recv[rank_],
                  rank_prefix(rank_, op) + "this rank sends itself " +
                      std::to_string(in_splits[rank_]) + " rows but expects " +
                      std::to_string(out_splits[rank_]) + "; the split sizes disagree");
  auto timeout = effective_timeout(opts);
  // Even splits can go through shared memory: every block then sits at rank x block size.
  const bool even = input_split_sizes.empty() && output_split_sizes.empty();
  return enqueue(Lane::kCollective, op, {output},
                 [this, op, out = output, in = input, send, recv, even, timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   ShmArena* arena = comm().shm();
                   if (arena && even) {
                     if (shm_all_to_all(ex, *arena, out, in, send, recv)) return;
                   } else {
                     ex.handshake(header_for(in, 0), send, recv);
                   }
                   at::Tensor src = staged(in, in.scalar_type());
                   at::Tensor work = staged_output(out, out.scalar_type());
                   std::vector<const char*> sp(size_);
                   std::vector<char*> rp(size_);
                   int64_t so = 0, ro = 0;
                   for (int p = 0; p < size_; ++p) {
                     sp[p] = bytes_of(src) + so;
                     rp[p] = bytes_of(work) + ro;
                     so += send[p];
                     ro += recv[p];
                   }
                   exchange_blocks(ex, sp, send, rp, recv);
                   unstage(out, work);
                 });
}

WorkPtr GlooBackend::all_to_all(std::vector<at::Tensor>& outputs,
                                const std::vector<at::Tensor>& inputs,
                                const AllToAllOptions& opts) {
  const std::string op = "all_to_all";
  TDIST_CHECK_ARG(
      static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
      rank_prefix(rank_, op) + "needs one input and one output per rank (" + std::to_string(size_) +
          "), got " + std::to_string(inputs.size()) + " inputs and " +
          std::to_string(outputs.size()) + " outputs");
  std::vector<int64_t> send(size_), recv(size_);
  for (int p = 0; p < size_; ++p) {
    check_tensor(inputs[p], op, rank_, "inputs[" + std::to_string(p) + "]");
    check_tensor(outputs[p], op, rank_, "outputs[" + std::to_string(p) + "]");
    check_same_dtype(inputs[0], inputs[p], op, rank_,
                     "inputs[0] and inputs[" + std::to_string(p) + "]");
    check_same_dtype(inputs[0], outputs[p], op, rank_,
                     "inputs[0] and outputs[" + std::to_string(p) + "]");
    send[p] = inputs[p].nbytes();
    recv[p] = outputs[p].nbytes();
  }
  TDIST_CHECK_ARG(send[rank_] == recv[rank_], rank_prefix(rank_, op) + "inputs[" +
                                                  std::to_string(rank_) + "] and outputs[" +
                                                  std::to_string(rank_) + "] differ in size");
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, outputs,
                 [this, op, outs = outputs, ins = inputs, send, recv, timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   ex.handshake(header_for(ins[0], 0), send, recv);
                   std::vector<at::Tensor> srcs, work;
                   std::vector<const char*> sp;
                   std::vector<char*> rp;
                   for (int p = 0; p < size_; ++p) {
                     srcs.push_back(staged(ins[p], ins[p].scalar_type()));
                     work.push_back(staged_output(outs[p], outs[p].scalar_type()));
                     sp.push_back(bytes_of(srcs[p]));
                     rp.push_back(bytes_of(work[p]));
                   }
                   exchange_blocks(ex, sp, send, rp, recv);
                   for (int p = 0; p < size_; ++p) unstage(outs[p], work[p]);
                 });
}

WorkPtr GlooBackend::barrier(const BarrierOptions& opts) {
  const std::string op = "barrier";
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, {}, [this, op, timeout]() {
    Exchange ex(comm(), start_op(comm(), op, timeout));
    ex.handshake(Header{}, {}, {});
  });
}

namespace {

// Peer-to-peer messages live on their own slots: bit 63 set, then the tag. A header with the
// payload size goes first on the same slot (FIFO per pair), so that a recv whose tensor does
// not match fails cleanly instead of letting libgloo abort.
uint64_t p2p_slot_base(int tag) {
  return (uint64_t(1) << 63) | (uint64_t(static_cast<uint32_t>(tag)) << 8);
}

OpInfo p2p_info(const std::string& op, int peer, int tag, std::chrono::milliseconds timeout) {
  OpInfo info;
  info.op = op + " (" + (peer < 0 ? std::string("any peer") : "peer " + std::to_string(peer)) +
            ", tag " + std::to_string(tag) + ")";
  info.timeout = timeout;
  info.deadline = Clock::now() + timeout;
  return info;
}

void check_peer(int peer, int rank, int size, const std::string& op) {
  TDIST_CHECK_ARG(peer >= 0 && peer < size,
                  rank_prefix(rank, op) + "peer rank " + std::to_string(peer) +
                      " is outside the group [0, " + std::to_string(size) + ")");
  TDIST_CHECK_ARG(peer != rank, rank_prefix(rank, op) + "a rank cannot " + op + " to itself");
}

}  // namespace

WorkPtr GlooBackend::send(const at::Tensor& tensor, int dst, const SendRecvOptions& opts) {
  const std::string op = "send";
  check_tensor(tensor, op, rank_, "tensor");
  check_peer(dst, rank_, size_, op);
  auto timeout = effective_timeout(opts);
  // The payload is snapshotted now (as c10d does for isend): the caller may reuse the tensor.
  // Header and payload are posted at once, so that a send never waits behind another one;
  // the send lane only waits for completion.
  at::Tensor payload = tensor.contiguous().clone();
  check_not_broken(op);
  auto ex = std::make_shared<Exchange>(comm(), p2p_info(op, dst, opts.tag_id, timeout));
  ex->set_slot_base(p2p_slot_base(opts.tag_id));
  auto header = std::make_shared<Header>(header_for(payload, payload.numel()));
  header->send_bytes = payload.nbytes();
  std::exception_ptr post_error;
  try {
    ex->post_send(dst, header.get(), sizeof(Header), 0, 0);
    ex->post_send(dst, bytes_of(payload), payload.nbytes(), 0, 0);
  } catch (...) {
    post_error = std::current_exception();
  }
  return enqueue(Lane::kSend, op, {tensor}, [ex, header, payload, post_error]() {
    if (post_error) std::rethrow_exception(post_error);
    ex->wait_all();
  });
}

WorkPtr GlooBackend::recv(at::Tensor& tensor, int src, const SendRecvOptions& opts) {
  check_peer(src, rank_, size_, "recv");
  return receive(tensor, src, opts);
}

WorkPtr GlooBackend::recv_anysource(at::Tensor& tensor, const SendRecvOptions& opts) {
  TDIST_CHECK_ARG(size_ > 1, rank_prefix(rank_, "recv") +
                                 "a receive from any source in a group of one rank would wait "
                                 "forever");
  return receive(tensor, -1, opts);
}

// A receive from any source takes the first header that arrives on the tag's slot from any
// peer (libgloo's recv from a rank list), then the payload from that peer: per pair and
// slot, messages arrive in the order they were sent, so it is that header's payload.
WorkPtr GlooBackend::receive(at::Tensor& tensor, int src, const SendRecvOptions& opts) {
  const std::string op = "recv";
  check_tensor(tensor, op, rank_, "tensor");
  auto timeout = effective_timeout(opts);
  auto source = std::make_shared<int>(src);
  WorkPtr work = enqueue(
      Lane::kRecv, op, {tensor},
      [this, op, t = tensor, src, tag = opts.tag_id, timeout, source]() mutable {
        Exchange ex(comm(), p2p_info(op, src, tag, timeout));
        ex.set_slot_base(p2p_slot_base(tag));
        Header h;
        size_t handle = 0;
        if (src >= 0) {
          handle = ex.post_recv(src, &h, sizeof(h), 0, 0);
        } else {
          std::vector<int> peers;
          for (int p = 0; p < size_; ++p) {
            if (p != rank_) peers.push_back(p);
          }
          handle = ex.post_recv_any(peers, &h, sizeof(h), 0, 0);
        }
        ex.wait(handle);
        const int from = ex.source(handle);
        *source = from;
        at::Tensor work = staged_output(t, t.scalar_type());
        const bool match = h.dtype == static_cast<int32_t>(t.scalar_type()) &&
                           h.send_bytes == static_cast<int64_t>(work.nbytes());
        if (!match) {
          // Drain the payload so the connection stays in step, then report.
          std::vector<char> sink(std::max<int64_t>(h.send_bytes, 1));
          ex.wait(ex.post_recv(from, sink.data(), h.send_bytes, 0, 0));
          TDIST_THROW(InvalidArgument,
                      rank_prefix(rank_, op) + "rank " + std::to_string(from) + " sent " +
                          std::to_string(h.total) + " elements of " +
                          std::string(c10::toString(static_cast<at::ScalarType>(h.dtype))) +
                          " (tag " + std::to_string(tag) + ") but this rank receives into " +
                          std::to_string(t.numel()) + " elements of " +
                          std::string(c10::toString(t.scalar_type())) + "; make the tensors match");
        }
        ex.wait(ex.post_recv(from, bytes_of(work), work.nbytes(), 0, 0));
        unstage(t, work);
      });
  // Runs before waiters wake (Work::then), so source_rank() is set once wait() returns.
  work->then([source](Work& w) { w.set_source_rank(*source); });
  return work;
}

}  // namespace tdist::gloo

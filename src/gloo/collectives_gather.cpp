// The data-moving collectives without reduction: broadcast, all_gather (+ into_tensor),
// gather, scatter.

#include <cstring>

#include <ATen/ATen.h>

#include "gloo/collective_common.h"
#include "gloo/ring.h"
#include "gloo/shm_collectives.h"
#include "tdist/gloo/gloo_backend.h"

namespace tdist::gloo {

using namespace tdist::detail;

WorkPtr GlooBackend::broadcast(at::Tensor& tensor, const BroadcastOptions& opts) {
  const std::string op = "broadcast";
  check_tensor(tensor, op, rank_, "tensor");
  check_root(opts.root, size_, op, rank_);
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, {tensor},
                 [this, op, t = tensor, root = opts.root, timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   if (ShmArena* arena = comm().shm()) {
                     if (shm_broadcast(ex, *arena, t, root)) return;
                   } else {
                     ex.handshake(header_for(t, t.numel(), -1, root), {}, {});
                   }
                   at::Tensor work = staged(t, t.scalar_type());
                   chain_broadcast(ex, bytes_of(work), work.nbytes(), root, kPhase1);
                   if (rank_ != root) unstage(t, work);
                 });
}

namespace {

// Ring all-gather into `chunks` (one per rank, `bytes` each) after copying `input` into ours.
void all_gather_chunks(Exchange& ex, std::vector<char*>& chunks, size_t bytes,
                       const at::Tensor& input) {
  char* mine = chunks[ex.rank()];
  if (mine != bytes_of(input)) std::memcpy(mine, bytes_of(input), bytes);
  ring_all_gather(ex, chunks, std::vector<size_t>(ex.size(), bytes), kPhase1);
}

// The TCP path of all_gather_into_tensor and all_gather_placed: every rank's `input` into
// `dst`, rank-major.
void all_gather_rank_major(Exchange& ex, const at::Tensor& input, char* dst) {
  at::Tensor src = staged(input, input.scalar_type());
  const size_t bytes = src.nbytes();
  std::vector<char*> chunks(ex.size());
  for (int c = 0; c < ex.size(); ++c) chunks[c] = dst + c * bytes;
  all_gather_chunks(ex, chunks, bytes, src);
}

}  // namespace

WorkPtr GlooBackend::all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                                            const AllgatherOptions& opts) {
  const std::string op = "all_gather_into_tensor";
  check_tensor(output, op, rank_, "output");
  check_tensor(input, op, rank_, "input");
  check_same_dtype(input, output, op, rank_, "input and output");
  TDIST_CHECK_ARG(output.numel() == input.numel() * size_,
                  rank_prefix(rank_, op) + "output has " + std::to_string(output.numel()) +
                      " elements but must have world_size (" + std::to_string(size_) +
                      ") x input (" + std::to_string(input.numel()) + ") elements");
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, {output},
                 [this, op, out = output, in = input, timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   if (ShmArena* arena = comm().shm()) {
                     if (shm_all_gather(ex, *arena, out, in)) return;
                   } else {
                     ex.handshake(header_for(in, in.numel()), {}, {});
                   }
                   at::Tensor work = staged_output(out, out.scalar_type());
                   all_gather_rank_major(ex, in, bytes_of(work));
                   unstage(out, work);
                 });
}

// Note [Placed all-gather]: the same collective as all_gather_into_tensor on the wire (the
// same op name and header), so ranks may mix the two.
WorkPtr GlooBackend::all_gather_placed(const at::Tensor& input, BlockPlacer place,
                                       const AllgatherOptions& opts) {
  const std::string op = "all_gather_into_tensor";
  check_tensor(input, op, rank_, "input");
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, {},
                 [this, op, in = input, place = std::move(place), timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   if (ShmArena* arena = comm().shm()) {
                     if (shm_all_gather_placed(ex, *arena, in, place)) return;
                   } else {
                     ex.handshake(header_for(in, in.numel()), {}, {});
                   }
                   const size_t bytes = in.nbytes();
                   at::Tensor gathered = at::empty({static_cast<int64_t>(bytes) * size_},
                                                   in.options().dtype(at::kByte));
                   all_gather_rank_major(ex, in, bytes_of(gathered));
                   for (int c = 0; c < size_; ++c) place(c, bytes_of(gathered) + c * bytes);
                 });
}

WorkPtr GlooBackend::all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                const AllgatherOptions& opts) {
  const std::string op = "all_gather";
  check_tensor(input, op, rank_, "input");
  check_per_rank_list(outputs, input, op, rank_, size_, "output", "input");
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, outputs,
                 [this, op, outs = outputs, in = input, timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   ex.handshake(header_for(in, in.numel()), {}, {});
                   at::Tensor src = staged(in, in.scalar_type());
                   std::vector<at::Tensor> work;
                   std::vector<char*> chunks;
                   for (auto& o : outs) {
                     work.push_back(staged_output(o, o.scalar_type()));
                     chunks.push_back(bytes_of(work.back()));
                   }
                   all_gather_chunks(ex, chunks, src.nbytes(), src);
                   for (size_t i = 0; i < outs.size(); ++i) unstage(outs[i], work[i]);
                 });
}

WorkPtr GlooBackend::gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                            const GatherOptions& opts) {
  const std::string op = "gather";
  check_tensor(input, op, rank_, "input");
  check_root(opts.root, size_, op, rank_);
  const bool is_root = rank_ == opts.root;
  if (is_root) {
    check_per_rank_list(outputs, input, op, rank_, size_, "output", "input", "the root ");
  } else {
    TDIST_CHECK_ARG(outputs.empty(), rank_prefix(rank_, op) +
                                         "outputs must be empty on non-root ranks (root is " +
                                         std::to_string(opts.root) + ")");
  }
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, outputs,
                 [this, op, outs = outputs, in = input, root = opts.root, timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   at::Tensor src = staged(in, in.scalar_type());
                   const int64_t bytes = src.nbytes();
                   std::vector<int64_t> send(size_, 0), recv(size_, 0);
                   if (rank_ == root) {
                     std::fill(recv.begin(), recv.end(), bytes);
                   } else {
                     send[root] = bytes;
                   }
                   ex.handshake(header_for(in, in.numel(), -1, root), send, recv);
                   if (rank_ != root) {
                     ex.send_segmented(root, bytes_of(src), bytes, from_rank(rank_));
                     ex.wait_all();
                     return;
                   }
                   std::vector<at::Tensor> work;
                   for (int p = 0; p < size_; ++p) {
                     work.push_back(staged_output(outs[p], outs[p].scalar_type()));
                     if (p == rank_) {
                       std::memcpy(bytes_of(work[p]), bytes_of(src), bytes);
                     } else {
                       ex.recv_segmented(p, bytes_of(work[p]), bytes, from_rank(p));
                     }
                   }
                   ex.wait_all();
                   for (int p = 0; p < size_; ++p) unstage(outs[p], work[p]);
                 });
}

WorkPtr GlooBackend::scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                             const ScatterOptions& opts) {
  const std::string op = "scatter";
  check_tensor(output, op, rank_, "output");
  check_root(opts.root, size_, op, rank_);
  const bool is_root = rank_ == opts.root;
  if (is_root) {
    check_per_rank_list(inputs, output, op, rank_, size_, "input", "output", "the root ");
  } else {
    TDIST_CHECK_ARG(inputs.empty(), rank_prefix(rank_, op) +
                                        "inputs must be empty on non-root ranks (root is " +
                                        std::to_string(opts.root) + ")");
  }
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, {output},
                 [this, op, out = output, ins = inputs, root = opts.root, timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   at::Tensor work = staged_output(out, out.scalar_type());
                   const int64_t bytes = work.nbytes();
                   std::vector<int64_t> send(size_, 0), recv(size_, 0);
                   if (rank_ == root) {
                     std::fill(send.begin(), send.end(), bytes);
                   } else {
                     recv[root] = bytes;
                   }
                   ex.handshake(header_for(out, out.numel(), -1, root), send, recv);
                   if (rank_ != root) {
                     ex.recv_segmented(root, bytes_of(work), bytes, from_rank(root) + 0);
                     ex.wait_all();
                     unstage(out, work);
                     return;
                   }
                   std::vector<at::Tensor> srcs;
                   for (int p = 0; p < size_; ++p) {
                     srcs.push_back(staged(ins[p], ins[p].scalar_type()));
                     if (p == rank_) {
                       std::memcpy(bytes_of(work), bytes_of(srcs[p]), bytes);
                     } else {
                       ex.send_segmented(p, bytes_of(srcs[p]), bytes, from_rank(root));
                     }
                   }
                   ex.wait_all();
                   unstage(out, work);
                 });
}

}  // namespace tdist::gloo

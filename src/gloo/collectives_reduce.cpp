// The reducing collectives: all_reduce (+ coalesced), reduce, reduce_scatter (+ tensor).

#include <cstring>

#include "gloo/collective_common.h"
#include "gloo/ring.h"
#include "gloo/shm_collectives.h"
#include "tdist/gloo/gloo_backend.h"

namespace tdist::gloo {

using namespace tdist::detail;

namespace {

// Below this many bytes a one-step exchange (everyone sends everything, every rank reduces
// in rank order) beats the 2(n-1) steps of the ring on latency.
constexpr size_t kDirectAllReduceBytes = 64 * 1024;

// All-reduce of a contiguous tensor in its accumulation dtype, in place.
void all_reduce_flat(Exchange& ex, at::Tensor& work, ReduceOp op) {
  const int n = ex.size();
  const int r = ex.rank();
  const size_t esz = work.element_size();
  const size_t numel = work.numel();
  const auto dtype = work.scalar_type();
  const ReduceFn fn = make_reduce_fn(op, dtype);
  char* base = bytes_of(work);
  if (n > 1 && numel * esz <= kDirectAllReduceBytes) {
    const size_t bytes = numel * esz;
    std::vector<char> all(bytes * n);
    std::vector<size_t> recvs;
    for (int p = 0; p < n; ++p) {
      if (p != r) recvs.push_back(ex.post_recv(p, all.data() + p * bytes, bytes, from_rank(p), 0));
    }
    for (int p = 0; p < n; ++p) {
      if (p != r) ex.post_send(p, base, bytes, from_rank(r), 0);
    }
    ex.wait_all();
    std::memcpy(all.data() + r * bytes, base, bytes);
    // Same order on every rank: bitwise identical results.
    std::memcpy(base, all.data(), bytes);
    for (int p = 1; p < n; ++p) fn(base, base, all.data() + p * bytes, numel);
  } else if (n > 1) {
    auto counts = even_chunks(numel, n);
    std::vector<char*> chunk(n);
    std::vector<size_t> bytes(n);
    size_t offset = 0;
    for (int c = 0; c < n; ++c) {
      chunk[c] = base + offset * esz;
      bytes[c] = counts[c] * esz;
      offset += counts[c];
    }
    std::vector<const char*> src(chunk.begin(), chunk.end());
    ring_reduce_scatter(ex, src, chunk, counts, esz, fn, kPhase1);
    finish_average(op, chunk[r], counts[r], dtype, n);
    ring_all_gather(ex, chunk, bytes, kPhase2);
    return;
  }
  finish_average(op, base, numel, dtype, n);
}

}  // namespace

WorkPtr GlooBackend::all_reduce(at::Tensor& tensor, const AllreduceOptions& opts) {
  const std::string op = "all_reduce";
  check_tensor(tensor, op, rank_, "tensor");
  check_reduce_op(opts.op, tensor.scalar_type(), op, rank_);
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, {tensor},
                 [this, op, t = tensor, rop = opts.op, timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   if (ShmArena* arena = comm().shm()) {
                     if (shm_all_reduce(ex, *arena, t, rop)) return;
                   } else {
                     ex.handshake(header_for(t, t.numel(), rop.code()), {}, {});
                   }
                   at::Tensor work = staged(t, accumulation_dtype(t.scalar_type()));
                   all_reduce_flat(ex, work, rop);
                   unstage(t, work);
                 });
}

WorkPtr GlooBackend::all_reduce_coalesced(std::vector<at::Tensor>& tensors,
                                          const AllreduceOptions& opts) {
  const std::string op = "all_reduce_coalesced";
  TDIST_CHECK_ARG(!tensors.empty(), rank_prefix(rank_, op) + "needs at least one tensor");
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_tensor(tensors[i], op, rank_, "tensors[" + std::to_string(i) + "]");
    check_same_dtype(tensors[0], tensors[i], op, rank_,
                     "tensors[0] and tensors[" + std::to_string(i) + "]");
    total += tensors[i].numel();
  }
  check_reduce_op(opts.op, tensors[0].scalar_type(), op, rank_);
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, tensors,
                 [this, op, ts = tensors, total, rop = opts.op, timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   ex.handshake(header_for(ts[0], total, rop.code()), {}, {});
                   const auto acc = accumulation_dtype(ts[0].scalar_type());
                   std::vector<at::Tensor> flat;
                   for (auto& t : ts) flat.push_back(t.reshape({-1}).to(acc));
                   at::Tensor work = at::cat(flat);
                   all_reduce_flat(ex, work, rop);
                   int64_t offset = 0;
                   for (auto& t : ts) {
                     t.copy_(work.narrow(0, offset, t.numel()).view(t.sizes()));
                     offset += t.numel();
                   }
                 });
}

WorkPtr GlooBackend::reduce(at::Tensor& tensor, const ReduceOptions& opts) {
  const std::string op = "reduce";
  check_tensor(tensor, op, rank_, "tensor");
  check_reduce_op(opts.op, tensor.scalar_type(), op, rank_);
  check_root(opts.root, size_, op, rank_);
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, {tensor},
                 [this, op, t = tensor, rop = opts.op, root = opts.root, timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   const int n = size_, r = rank_;
                   const int64_t numel = t.numel();
                   ex.handshake(header_for(t, numel, rop.code(), root), {}, {});
                   const auto acc = accumulation_dtype(t.scalar_type());
                   // Non-roots keep their input intact: the ring overwrites its buffer.
                   at::Tensor work = r == root ? staged(t, acc) : t.contiguous().to(acc).clone();
                   const size_t esz = work.element_size();
                   auto counts = even_chunks(numel, n);
                   std::vector<char*> chunk(n);
                   size_t offset = 0;
                   for (int c = 0; c < n; ++c) {
                     chunk[c] = bytes_of(work) + offset * esz;
                     offset += counts[c];
                   }
                   std::vector<const char*> src(chunk.begin(), chunk.end());
                   ring_reduce_scatter(ex, src, chunk, counts, esz, make_reduce_fn(rop, acc),
                                       kPhase1);
                   finish_average(rop, chunk[r], counts[r], acc, n);
                   if (n > 1) {
                     if (r == root) {
                       for (int p = 0; p < n; ++p) {
                         if (p != r) ex.recv_segmented(p, chunk[p], counts[p] * esz, from_rank(p));
                       }
                     } else {
                       ex.send_segmented(root, chunk[r], counts[r] * esz, from_rank(r));
                     }
                     ex.wait_all();
                   }
                   if (r == root) unstage(t, work);
                 });
}

namespace {

// Shared body of reduce_scatter and reduce_scatter_tensor: src[c] is this rank's contribution
// to rank c's output (numel elements each, contiguous, accumulation dtype).
void reduce_scatter_flat(Exchange& ex, const std::vector<const char*>& src, at::Tensor& out,
                         ReduceOp rop) {
  const int n = ex.size();
  const size_t numel = out.numel();
  std::vector<char*> dst(n, nullptr);
  dst[ex.rank()] = bytes_of(out);
  ring_reduce_scatter(ex, src, dst, std::vector<size_t>(n, numel), out.element_size(),
                      make_reduce_fn(rop, out.scalar_type()), kPhase1);
  finish_average(rop, bytes_of(out), numel, out.scalar_type(), n);
}

}  // namespace

WorkPtr GlooBackend::reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                                           const ReduceScatterOptions& opts) {
  const std::string op = "reduce_scatter_tensor";
  check_tensor(output, op, rank_, "output");
  check_tensor(input, op, rank_, "input");
  check_same_dtype(input, output, op, rank_, "input and output");
  check_reduce_op(opts.op, input.scalar_type(), op, rank_);
  TDIST_CHECK_ARG(input.numel() == output.numel() * size_,
                  rank_prefix(rank_, op) + "input has " + std::to_string(input.numel()) +
                      " elements but must have world_size (" + std::to_string(size_) +
                      ") x output (" + std::to_string(output.numel()) + ") elements");
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, {output},
                 [this, op, out = output, in = input, rop = opts.op, timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   if (ShmArena* arena = comm().shm()) {
                     if (shm_reduce_scatter(ex, *arena, out, in, rop)) return;
                   } else {
                     ex.handshake(header_for(out, out.numel(), rop.code()), {}, {});
                   }
                   const auto acc = accumulation_dtype(out.scalar_type());
                   at::Tensor src = staged(in, acc);
                   at::Tensor work = staged_output(out, acc);
                   const size_t chunk_bytes = work.numel() * work.element_size();
                   std::vector<const char*> ptrs(size_);
                   for (int c = 0; c < size_; ++c) ptrs[c] = bytes_of(src) + c * chunk_bytes;
                   reduce_scatter_flat(ex, ptrs, work, rop);
                   unstage(out, work);
                 });
}

WorkPtr GlooBackend::reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                    const ReduceScatterOptions& opts) {
  const std::string op = "reduce_scatter";
  check_tensor(output, op, rank_, "output");
  check_reduce_op(opts.op, output.scalar_type(), op, rank_);
  check_per_rank_list(inputs, output, op, rank_, size_, "input", "output");
  auto timeout = effective_timeout(opts);
  return enqueue(Lane::kCollective, op, {output},
                 [this, op, out = output, ins = inputs, rop = opts.op, timeout]() mutable {
                   Exchange ex(comm(), start_op(comm(), op, timeout));
                   ex.handshake(header_for(out, out.numel(), rop.code()), {}, {});
                   const auto acc = accumulation_dtype(out.scalar_type());
                   std::vector<at::Tensor> srcs;
                   std::vector<const char*> ptrs;
                   for (auto& in : ins) {
                     srcs.push_back(staged(in, acc));
                     ptrs.push_back(bytes_of(srcs.back()));
                   }
                   at::Tensor work = staged_output(out, acc);
                   reduce_scatter_flat(ex, ptrs, work, rop);
                   unstage(out, work);
                 });
}

}  // namespace tdist::gloo

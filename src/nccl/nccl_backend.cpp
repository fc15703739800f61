// The NCCL engine: every op of c10d's ProcessGroupNCCL on one communicator, one
// communication stream and one watchdog (docs/nccl.md).
//
// Note [Stream semantics]: as c10d, a collective runs on the group's own stream after an
// event recorded on the caller's current stream, so it sees every kernel the caller queued
// before it. Its tensors are marked in use by that stream (recordStream), so the caching
// allocator never hands their memory out again before the collective is done with it, even
// when the caller drops them at once. Work::wait() makes the caller's current stream wait on
// the collective's end event and returns; the host blocks only for barrier() and under
// TORCH_NCCL_BLOCKING_WAIT. Scratch buffers (all_gather's and reduce_scatter's flat copies)
// are allocated on the communication stream, so their reuse is ordered by that stream.

#include "tdist/nccl/nccl_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include "nccl/all_to_all_plan.h"
#include "nccl/communicator.h"
#include "nccl/device_choice.h"
#include "nccl/nccl_types.h"
#include "nccl/nccl_work.h"
#include "nccl/reduction.h"
#include "nccl/watchdog.h"
#include "tdist/comm/backend.h"
#include "tdist/error.h"

namespace tdist::nccl {

namespace {

using detail::Clock;
using detail::Communicator;
using detail::nccl_dtype;
using detail::nccl_reduce_op;
using detail::NCCLWork;
using detail::Reduction;

/// `tensors` followed by `more`.
std::vector<at::Tensor> with(std::vector<at::Tensor> tensors, const std::vector<at::Tensor>& more) {
  tensors.insert(tensors.end(), more.begin(), more.end());
  return tensors;
}

/// One NCCL call (or group of calls) issued inside a collective, on `stream`.
using Body = std::function<void(cudaStream_t stream, Clock::time_point deadline)>;

/// Makes `device` this thread's current GPU (so that the rank's "cuda" tensors land on its
/// own GPU, as device_id binds it) and returns a communication stream on it.
c10::cuda::CUDAStream bind_device_and_get_stream(int device, bool high_priority) {
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  return at::cuda::getStreamFromPool(high_priority, static_cast<c10::DeviceIndex>(device));
}

class NCCLBackend : public CollectiveBackend {
 public:
  NCCLBackend(const StorePtr& store, int rank, int size, std::chrono::milliseconds timeout,
              int device, const NCCLBackendOptions& options)
      : NCCLBackend(rank, size, timeout, device, options,
                    Communicator::create(*store, rank, size, device, timeout)) {}

  /// A backend on a communicator split or shrunk from another (split_group, shrink_group).
  NCCLBackend(int rank, int size, std::chrono::milliseconds timeout, int device,
              const NCCLBackendOptions& options, std::unique_ptr<Communicator> comm)
      : CollectiveBackend(rank, size),
        device_(c10::kCUDA, static_cast<c10::DeviceIndex>(device)),
        timeout_(timeout),
        options_(options),
        stream_(bind_device_and_get_stream(device, options.high_priority_stream())),
        comm_(std::move(comm)),
        watchdog_(std::make_unique<detail::Watchdog>(
            *comm_, who(), options.watchdog_interval(),
            [this](const std::string& reason, bool timed_out) { on_fatal(reason, timed_out); })) {}

  ~NCCLBackend() override {
    watchdog_.reset();  // before the communicator it watches
    comm_.reset();
  }

  std::string name() const override { return "nccl"; }
  bool takes_device_tensors(c10::DeviceType type) const override { return type == c10::kCUDA; }

  // Note [Aborting on a lost peer]: ncclCommAbort makes kernels waiting on the lost peer
  // return; every Work in flight fails with the reason and every later call is refused.
  bool abort(const std::string& reason) override {
    mark_broken(who() + ": nccl " + reason);
    watchdog_->abort_in_flight("was interrupted: " + reason);
    return true;
  }

  WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts) override {
    return run("broadcast", opts, {tensor}, {tensor}, [&](cudaStream_t s, Clock::time_point d) {
      check(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                          nccl_dtype(tensor.scalar_type()), opts.root, comm(), s),
            "broadcast", d);
    });
  }

  bool supports_premul_sum() const override { return true; }

  bool supports_splitting() const override { return true; }
  CollectiveBackendPtr split(const std::vector<int>& ranks, int color,
                             std::chrono::milliseconds timeout,
                             const std::any& pg_options) override {
    const NCCLBackendOptions options = options_or_parents(pg_options, "split_group");
    const auto it = std::find(ranks.begin(), ranks.end(), rank_);
    const int key = static_cast<int>(it - ranks.begin());
    auto comm = Communicator::split(*comm_, ranks.empty() ? -1 : color, key, timeout);
    if (!comm) return nullptr;
    return std::make_shared<NCCLBackend>(key, static_cast<int>(ranks.size()), timeout,
                                         device_.index(), options, std::move(comm));
  }

  bool supports_shrinking() const override { return Communicator::can_shrink(); }
  CollectiveBackendPtr shrink(const std::vector<int>& excluded, int flags,
                              std::chrono::milliseconds timeout,
                              const std::any& pg_options) override {
    const NCCLBackendOptions options = options_or_parents(pg_options, "shrink_group");
    const int below = static_cast<int>(
        std::count_if(excluded.begin(), excluded.end(), [&](int r) { return r < rank_; }));
    auto comm = Communicator::shrink(*comm_, excluded, flags, timeout);
    return std::make_shared<NCCLBackend>(rank_ - below, size_ - static_cast<int>(excluded.size()),
                                         timeout, device_.index(), options, std::move(comm));
  }

  WorkPtr all_reduce(at::Tensor& tensor, const AllreduceOptions& opts) override {
    const Reduction reduction(opts.op, tensor);
    return run("all_reduce", opts, with({tensor}, reduction.tensors()), {tensor},
               [&](cudaStream_t s, Clock::time_point d) {
                 const Reduction::Scoped op(reduction, comm());
                 check(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                     nccl_dtype(tensor.scalar_type()), op.get(), comm(), s),
                       "all_reduce", d);
               });
  }

  WorkPtr all_reduce_coalesced(std::vector<at::Tensor>& tensors,
                               const AllreduceOptions& opts) override {
    // One dtype for the list (the front end checks it), so one reduction serves every tensor.
    const Reduction reduction(opts.op, tensors.at(0));
    return run("all_reduce_coalesced", opts, with(tensors, reduction.tensors()), tensors,
               [&](cudaStream_t s, Clock::time_point d) {
                 const Reduction::Scoped op(reduction, comm());
                 group(d, [&] {
                   for (auto& t : tensors) {
                     check(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(),
                                         nccl_dtype(t.scalar_type()), op.get(), comm(), s),
                           "all_reduce_coalesced", d);
                   }
                 });
               });
  }

  WorkPtr reduce(at::Tensor& tensor, const ReduceOptions& opts) override {
    const Reduction reduction(opts.op, tensor);
    return run("reduce", opts, with({tensor}, reduction.tensors()), {tensor},
               [&](cudaStream_t s, Clock::time_point d) {
                 const Reduction::Scoped op(reduction, comm());
                 check(ncclReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                  nccl_dtype(tensor.scalar_type()), op.get(), opts.root, comm(), s),
                       "reduce", d);
               });
  }

  WorkPtr all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                                 const AllgatherOptions& opts) override {
    return run("all_gather_into_tensor", opts, {input}, {output},
               [&](cudaStream_t s, Clock::time_point d) {
                 check(ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                                     nccl_dtype(input.scalar_type()), comm(), s),
                       "all_gather_into_tensor", d);
               });
  }

  WorkPtr all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                     const AllgatherOptions& opts) override {
    return run("all_gather", opts, {input}, outputs, [&](cudaStream_t s, Clock::time_point d) {
      at::Tensor flat = at::empty({size_ * input.numel()}, input.options());
      check(ncclAllGather(input.data_ptr(), flat.data_ptr(), input.numel(),
                          nccl_dtype(input.scalar_type()), comm(), s),
            "all_gather", d);
      for (int r = 0; r < size_; ++r) {
        outputs[r].view(-1).copy_(flat.narrow(0, r * input.numel(), input.numel()), true);
      }
    });
  }

  WorkPtr gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                 const GatherOptions& opts) override {
    return run("gather", opts, {input}, outputs, [&](cudaStream_t s, Clock::time_point d) {
      const ncclDataType_t type = nccl_dtype(input.scalar_type());
      group(d, [&] {
        if (rank_ != opts.root) {
          check(ncclSend(input.data_ptr(), input.numel(), type, opts.root, comm(), s), "gather", d);
          return;
        }
        for (int r = 0; r < size_; ++r) {
          if (r == rank_) continue;
          check(ncclRecv(outputs[r].data_ptr(), outputs[r].numel(), type, r, comm(), s), "gather",
                d);
        }
      });
      if (rank_ == opts.root) outputs[rank_].view(-1).copy_(input.view(-1), true);
    });
  }

  WorkPtr scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                  const ScatterOptions& opts) override {
    return run("scatter", opts, inputs, {output}, [&](cudaStream_t s, Clock::time_point d) {
      const ncclDataType_t type = nccl_dtype(output.scalar_type());
      group(d, [&] {
        if (rank_ != opts.root) {
          check(ncclRecv(output.data_ptr(), output.numel(), type, opts.root, comm(), s), "scatter",
                d);
          return;
        }
        for (int r = 0; r < size_; ++r) {
          if (r == rank_) continue;
          check(ncclSend(inputs[r].data_ptr(), inputs[r].numel(), type, r, comm(), s), "scatter",
                d);
        }
      });
      if (rank_ == opts.root) output.view(-1).copy_(inputs[rank_].view(-1), true);
    });
  }

  WorkPtr reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                                const ReduceScatterOptions& opts) override {
    const Reduction reduction(opts.op, input);
    return run("reduce_scatter_tensor", opts, with({input}, reduction.tensors()), {output},
               [&](cudaStream_t s, Clock::time_point d) {
                 const Reduction::Scoped op(reduction, comm());
                 check(ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                                         nccl_dtype(input.scalar_type()), op.get(), comm(), s),
                       "reduce_scatter_tensor", d);
               });
  }

  WorkPtr reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                         const ReduceScatterOptions& opts) override {
    const Reduction reduction(opts.op, output);
    return run("reduce_scatter", opts, with(inputs, reduction.tensors()), {output},
               [&](cudaStream_t s, Clock::time_point d) {
                 std::vector<at::Tensor> flat_inputs;
                 for (const auto& t : inputs) flat_inputs.push_back(t.reshape({-1}));
                 at::Tensor flat = at::cat(flat_inputs);
                 const Reduction::Scoped op(reduction, comm());
                 check(ncclReduceScatter(flat.data_ptr(), output.data_ptr(), output.numel(),
                                         nccl_dtype(output.scalar_type()), op.get(), comm(), s),
                       "reduce_scatter", d);
               });
  }

  WorkPtr all_to_all_single(at::Tensor& output, const at::Tensor& input,
                            const std::vector<int64_t>& output_split_sizes,
                            const std::vector<int64_t>& input_split_sizes,
                            const AllToAllOptions& opts) override {
    const detail::AllToAllPlan plan = detail::plan_all_to_all_single(
        input.sizes(), output.sizes(), input_split_sizes, output_split_sizes, size_, rank_);
    return run(
        "all_to_all_single", opts, {input}, {output}, [&](cudaStream_t s, Clock::time_point d) {
          const ncclDataType_t type = nccl_dtype(input.scalar_type());
          const size_t bytes = input.element_size();
          auto* in = static_cast<char*>(input.data_ptr());
          auto* out = static_cast<char*>(output.data_ptr());
          group(d, [&] {
            for (int r = 0; r < size_; ++r) {
              if (r == rank_) continue;
              check(ncclSend(in + plan.send.offset[r] * bytes, plan.send.count[r], type, r, comm(),
                             s),
                    "all_to_all_single", d);
              check(ncclRecv(out + plan.recv.offset[r] * bytes, plan.recv.count[r], type, r, comm(),
                             s),
                    "all_to_all_single", d);
            }
          });
          // This rank's own block: one device copy on the same stream, not a send to
          // itself through NCCL's kernels (the plan checked both counts agree).
          output.view(-1)
              .narrow(0, plan.recv.offset[rank_], plan.recv.count[rank_])
              .copy_(input.view(-1).narrow(0, plan.send.offset[rank_], plan.send.count[rank_]),
                     /*non_blocking=*/true);
        });
  }

  WorkPtr all_to_all(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                     const AllToAllOptions& opts) override {
    const int64_t to_self = inputs.at(rank_).numel(), from_self = outputs.at(rank_).numel();
    if (to_self != from_self) {
      TDIST_THROW(InvalidArgument, who() + ": nccl all_to_all: this rank sends itself " +
                                       std::to_string(to_self) + " elements (input_tensor_list[" +
                                       std::to_string(rank_) + "]) but expects " +
                                       std::to_string(from_self) + " (output_tensor_list[" +
                                       std::to_string(rank_) + "])");
    }
    return run("all_to_all", opts, inputs, outputs, [&](cudaStream_t s, Clock::time_point d) {
      group(d, [&] {
        for (int r = 0; r < size_; ++r) {
          if (r == rank_) continue;
          check(ncclSend(inputs[r].data_ptr(), inputs[r].numel(),
                         nccl_dtype(inputs[r].scalar_type()), r, comm(), s),
                "all_to_all", d);
          check(ncclRecv(outputs[r].data_ptr(), outputs[r].numel(),
                         nccl_dtype(outputs[r].scalar_type()), r, comm(), s),
                "all_to_all", d);
        }
      });
      outputs[rank_].copy_(inputs[rank_], /*non_blocking=*/true);  // this rank's own block
    });
  }

  WorkPtr barrier(const BarrierOptions& opts) override {
    // As c10d: a one-element all_reduce on this rank's GPU whose wait() blocks the host.
    at::Tensor token = at::zeros({1}, at::TensorOptions().device(device_).dtype(at::kFloat));
    return run(
        "barrier", opts, {token}, {},
        [&](cudaStream_t s, Clock::time_point d) {
          check(
              ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum, comm(), s),
              "barrier", d);
        },
        /*blocks_host=*/true);
  }

  // NCCL has no tags: sends and receives between two ranks match in issue order (as c10d).
  WorkPtr send(const at::Tensor& tensor, int dst, const SendRecvOptions& opts) override {
    return run("send", opts, {tensor}, {}, [&](cudaStream_t s, Clock::time_point d) {
      check(ncclSend(tensor.data_ptr(), tensor.numel(), nccl_dtype(tensor.scalar_type()), dst,
                     comm(), s),
            "send", d);
    });
  }

  WorkPtr recv(at::Tensor& tensor, int src, const SendRecvOptions& opts) override {
    return run("recv", opts, {}, {tensor}, [&](cudaStream_t s, Clock::time_point d) {
      check(ncclRecv(tensor.data_ptr(), tensor.numel(), nccl_dtype(tensor.scalar_type()), src,
                     comm(), s),
            "recv", d);
    });
  }

  // NCCL receives only from a named peer, and so does c10d's NCCL backend.
  WorkPtr recv_anysource(at::Tensor&, const SendRecvOptions&) override {
    TDIST_THROW(InvalidArgument, who() +
                                     ": nccl cannot receive from any source (NCCL receives only "
                                     "from a named peer; PyTorch's NCCL backend refuses it too); "
                                     "give src or group_src, or receive on a gloo group");
  }

  WorkPtr batch_send_recv(std::vector<PointToPoint>& ops, const CollectiveOptions& opts) override {
    std::vector<at::Tensor> sent, received;
    for (const auto& op : ops) (op.is_send ? sent : received).push_back(op.tensor);
    return run("batch_isend_irecv", opts, sent, received, [&](cudaStream_t s, Clock::time_point d) {
      group(d, [&] {
        for (auto& op : ops) {
          const ncclDataType_t type = nccl_dtype(op.tensor.scalar_type());
          check(op.is_send
                    ? ncclSend(op.tensor.data_ptr(), op.tensor.numel(), type, op.peer, comm(), s)
                    : ncclRecv(op.tensor.data_ptr(), op.tensor.numel(), type, op.peer, comm(), s),
                "batch_isend_irecv", d);
        }
      });
    });
  }

 private:
  std::string who() const {
    return "rank " + std::to_string(rank_) + " (cuda:" + std::to_string(device_.index()) + ")";
  }
  ncclComm_t comm() const { return comm_->get(); }

  NCCLBackendOptions options_or_parents(const std::any& pg_options, const char* op) const {
    if (!pg_options.has_value()) return options_;
    if (const auto* options = std::any_cast<NCCLBackendOptions>(&pg_options)) return *options;
    TDIST_THROW(InvalidArgument, who() + ": " + op +
                                     ": nccl's pg_options are a tdist::nccl::NCCLBackendOptions "
                                     "(got another type)");
  }

  void check(ncclResult_t result, const char* what, Clock::time_point deadline) {
    comm_->check(result, what, deadline);
  }

  /// Runs `calls` between ncclGroupStart and ncclGroupEnd: NCCL launches them as one.
  void group(Clock::time_point deadline, const std::function<void()>& calls) {
    check(ncclGroupStart(), "ncclGroupStart", deadline);
    try {
      calls();
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    check(ncclGroupEnd(), "ncclGroupEnd", deadline);
  }

  void check_tensor(const at::Tensor& t, const std::string& op) const {
    if (!t.is_cuda()) {
      TDIST_THROW(InvalidArgument, who() + ": nccl " + op + " got a tensor on " + t.device().str() +
                                       "; nccl takes CUDA tensors (for CPU tensors use "
                                       "backend \"cpu:gloo,cuda:nccl\")");
    }
    if (t.device() != device_) {
      TDIST_THROW(InvalidArgument, who() + ": nccl " + op + " got a tensor on " + t.device().str() +
                                       " but this rank's communicator is on " + device_.str() +
                                       "; move it there, or bind another GPU with device_id");
    }
    if (!t.is_contiguous()) {
      TDIST_THROW(InvalidArgument, who() + ": nccl " + op + " needs contiguous tensors");
    }
  }

  WorkPtr run(const std::string& op, const CollectiveOptions& opts,
              const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
              const Body& body, bool blocks_host = false) {
    check_not_broken(op);
    // Every check before the first NCCL call: a call left half-issued (a group with some
    // sends queued) would leave the peers waiting.
    for (const auto* list : {&inputs, &outputs}) {
      for (const auto& t : *list) {
        check_tensor(t, op);
        nccl_dtype(t.scalar_type());
      }
    }
    const auto timeout = opts.timeout.count() >= 0 ? opts.timeout : timeout_;
    const auto deadline = Clock::now() + timeout;
    c10::cuda::CUDAGuard guard(device_);
    // Note [Stream semantics]: after everything the caller queued on its current stream.
    at::cuda::CUDAEvent ready;
    ready.record(at::cuda::getCurrentCUDAStream(device_.index()));
    ready.block(stream_);
    try {
      const Communicator::Lease lease = comm_->lease();
      c10::cuda::CUDAStreamGuard on_comm_stream(stream_);
      body(stream_.stream(), deadline);
    } catch (const c10::Error&) {
      // One of our own allocations or copies failed (out of memory): NCCL's state is intact,
      // and whatever it queued completes with the peers. The caller sees the error.
      throw;
    } catch (const std::exception& e) {
      // NCCL refused part of the collective: what it queued can never complete. Abort so
      // nothing here waits on it, and fail the collectives still in flight, whose results
      // the abort leaves undefined; the peers' watchdogs time out and report.
      const std::string reason = "failed while being issued: " + std::string(e.what());
      mark_broken(who() + ": nccl " + op + " " + reason);
      watchdog_->abort_in_flight("was aborted when a later nccl " + op + " " + reason);
      throw;
    }
    for (const auto* list : {&inputs, &outputs}) {
      for (const auto& t : *list) {
        if (t.numel() > 0)
          c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
      }
    }
    auto work = std::make_shared<NCCLWork>(op, outputs, device_, deadline,
                                           blocks_host || options_.blocking_wait());
    work->record_end(stream_);
    watchdog_->watch(work);
    return work;
  }

  // Called once by the watchdog after it failed every in-flight Work. Later calls raise the
  // reason (mark_broken). As c10d's TORCH_NCCL_ASYNC_ERROR_HANDLING, a process that does not
  // block on its collectives would go on computing on results that never arrived: unless
  // blocking wait delivers the error to the waiter, the process ends here, after the flight
  // recorder's report (the failed Works' callbacks) is out.
  void on_fatal(const std::string& reason, bool timed_out) {
    mark_broken(who() + ": nccl " + reason);
    if (options_.blocking_wait() || !options_.tear_down_on_error()) return;
    std::cerr << "tdist: " << who() << ": a NCCL collective " << reason
              << (timed_out ? " (the flight recorder's report is above)" : "")
              << "; ending the process, since its CUDA results are "
              << "undefined (set TORCH_NCCL_BLOCKING_WAIT=1 to get the error from Work::wait "
                 "instead)\n"
              << std::flush;
    std::_Exit(1);
  }

  c10::Device device_;
  std::chrono::milliseconds timeout_;
  NCCLBackendOptions options_;
  c10::cuda::CUDAStream stream_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<detail::Watchdog> watchdog_;
};

}  // namespace

CollectiveBackendPtr make_nccl_backend(const StorePtr& store, int rank, int size,
                                       std::chrono::milliseconds timeout,
                                       const NCCLBackendOptions& options) {
  const char* local_rank = std::getenv("LOCAL_RANK");
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const int device = detail::choose_device_index(
      options.device_index(), device_id_for_new_backends(), local_rank ? local_rank : "", rank,
      c10::cuda::device_count(), visible != nullptr && *visible != '\0');
  return std::make_shared<NCCLBackend>(store, rank, size, timeout, device, options);
}

std::tuple<int, int, int> nccl_version_compiled() {
  return {NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH};
}

std::tuple<int, int, int> nccl_version_loaded() {
  int code = 0;
  ncclGetVersion(&code);
  // NCCL_VERSION(X,Y,Z) is X*10000 + Y*100 + Z since 2.9.
  return {code / 10000, (code % 10000) / 100, code % 100};
}

}  // namespace tdist::nccl

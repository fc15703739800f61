#include "tdist/mpi/mpi_backend.h"

#include <climits>
#include <cstdlib>
#include <numeric>
#include <set>
#include <thread>

#include <ATen/ATen.h>

#include "mpi/direct_collectives.h"
#include "mpi/executor.h"
#include "mpi/mpi_types.h"
#include "mpi/shm_collectives.h"
#include "tdist/error.h"

namespace tdist::mpi {

namespace detail {
struct Communicator {
  MPI_Comm comm = MPI_COMM_NULL;
  // A duplicate for the direct collectives' point-to-point messages (Note [Direct
  // collectives]), so they never match the user's send/recv on `comm`.
  MPI_Comm p2p = MPI_COMM_NULL;
  std::shared_ptr<ScratchPool> pool = std::make_shared<ScratchPool>();
  std::shared_ptr<uint32_t> sequence = std::make_shared<uint32_t>(0);
  // Staging segments for the shared-memory collectives (Note [Shared-memory collectives]);
  // null when some rank is on another node or TDIST_MPI_SHM=0.
  std::shared_ptr<ShmWindow> shm;
  // This communicator's collectives in the executor (Note [Executor lanes]).
  std::shared_ptr<Lane> lane = std::make_shared<Lane>();
  // The environment this communicator's backend was created with.
  MPIEnvironment env = MPIEnvironment::from_env();

  DirectComm direct(int rank, int size) const {
    return DirectComm{p2p, rank, size, pool, sequence};
  }
};
}  // namespace detail

using detail::check_mpi;
using detail::Executor;
using detail::stage;
using detail::Staged;
using detail::StartedOp;

namespace {

int checked_count(int64_t numel, const char* op) {
  TDIST_CHECK_ARG(numel <= INT_MAX, std::string("mpi: ") + op + " of " + std::to_string(numel) +
                                        " elements exceeds MPI's int count; split the tensor");
  return static_cast<int>(numel);
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op) {
  TDIST_CHECK_ARG(a.scalar_type() == b.scalar_type(), std::string("mpi: ") + op +
                                                          ": input and output dtypes differ (" +
                                                          c10::toString(a.scalar_type()) + " vs " +
                                                          c10::toString(b.scalar_type()) + ")");
}

void check_root(int root, int size, const char* op) {
  TDIST_CHECK_ARG(root >= 0 && root < size,
                  std::string("mpi: ") + op + ": root " + std::to_string(root) +
                      " is out of range for a group of " + std::to_string(size));
}

// Note [One prologue]: every op of this backend hands MPI a contiguous host buffer (the
// tensor itself, or a staged copy: Staged in mpi_types.h), its element count as
// MPI's int and the MPI datatype of its dtype; StagedBuffer holds the three, and
// one_request issues the op's single nonblocking call with what runs once it completes.
struct StagedBuffer {
  Staged staged;
  int count = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  void* data() const { return staged.buffer.data_ptr(); }
};

StagedBuffer staged_buffer(const at::Tensor& tensor, bool for_reduction, const char* op) {
  Staged staged = stage(tensor, for_reduction);
  const int count = checked_count(staged.buffer.numel(), op);
  const MPI_Datatype type = detail::mpi_datatype(staged.buffer.scalar_type());
  return {std::move(staged), count, type};
}

// `issue(request)` starts one nonblocking MPI call (named `call` in errors).
template <typename Issue>
StartedOp one_request(const char* call, Issue&& issue, std::function<void()> on_complete) {
  StartedOp s;
  s.requests.resize(1);
  check_mpi(issue(&s.requests[0]), call);
  s.on_complete = std::move(on_complete);
  return s;
}

// The end of a reduction whose result is in `result`'s buffer: MPI has no average, so AVG
// reduces with SUM and divides here; then the result goes back to the user's tensor.
std::function<void()> finish_reduction(Staged result, bool average, int size) {
  return [result = std::move(result), average, size] {
    if (average) result.buffer.div_(size);
    result.copy_back();
  };
}

}  // namespace

MPIBackend::MPIBackend(const StorePtr& store, int rank, int size, std::chrono::milliseconds timeout)
    : CollectiveBackend(rank, size),
      comm_(std::make_unique<detail::Communicator>()),
      timeout_(timeout) {
  auto& executor = Executor::instance();
  std::vector<int> world_ranks(size);
  if (store) {
    store->set("mpi/world_rank/" + std::to_string(rank), std::to_string(executor.world_rank()));
    for (int r = 0; r < size; ++r) {
      world_ranks[r] = std::stoi(store->get_string("mpi/world_rank/" + std::to_string(r)));
    }
    std::set<int> unique(world_ranks.begin(), world_ranks.end());
    TDIST_CHECK_ARG(static_cast<int>(unique.size()) == size,
                    "mpi: two group ranks map to the same MPI process; was the job started "
                    "with mpirun (each rank its own MPI process)?");
  } else {
    TDIST_CHECK_ARG(size == executor.world_size() && rank == executor.world_rank(),
                    "mpi: without a store the group must be the whole MPI world in MPI rank "
                    "order (rank " +
                        std::to_string(rank) + "/" + std::to_string(size) + " vs MPI " +
                        std::to_string(executor.world_rank()) + "/" +
                        std::to_string(executor.world_size()) + ")");
    std::iota(world_ranks.begin(), world_ranks.end(), 0);
  }
  executor.run_sync([&] {
    MPI_Group world_group, group;
    check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group");
    check_mpi(MPI_Group_incl(world_group, size, world_ranks.data(), &group), "MPI_Group_incl");
    // Groups are created one at a time per process, in the same order on every member (as
    // new_group requires), so a fixed tag cannot mix two creations up.
    check_mpi(MPI_Comm_create_group(MPI_COMM_WORLD, group, /*tag=*/4242, &comm_->comm),
              "MPI_Comm_create_group");
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    MPI_Comm_set_errhandler(comm_->comm, MPI_ERRORS_RETURN);
    check_mpi(MPI_Comm_dup(comm_->comm, &comm_->p2p), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_->p2p, MPI_ERRORS_RETURN);
    comm_->shm = detail::ShmWindow::create(comm_->comm, rank, size, comm_->env);
    int comm_rank = -1;
    MPI_Comm_rank(comm_->comm, &comm_rank);
    if (comm_rank != rank) {
      TDIST_THROW(DistBackendError, "mpi: communicator rank " + std::to_string(comm_rank) +
                                        " differs from group rank " + std::to_string(rank));
    }
  });
}

MPIBackend::~MPIBackend() {
  if (comm_ && comm_->comm != MPI_COMM_NULL) {
    MPI_Comm comm = comm_->comm, p2p = comm_->p2p;
    try {
      Executor::instance().run_sync([comm, p2p]() mutable {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (finalized) return;
        if (p2p != MPI_COMM_NULL) MPI_Comm_free(&p2p);
        MPI_Comm_free(&comm);
      });
    } catch (...) {
      // Destructors never throw; a failed free only leaks a communicator.
    }
  }
}

std::chrono::milliseconds MPIBackend::deadline_for(const CollectiveOptions& opts) const {
  return opts.timeout.count() >= 0 ? opts.timeout : timeout_;
}

namespace {

Executor::Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return timeout.count() > 0 ? Executor::Clock::now() + timeout
                             : Executor::Clock::time_point::max();
}

detail::ShmOpContext shm_context(const detail::Communicator& comm, int rank, const char* op,
                                 std::chrono::milliseconds timeout) {
  return detail::ShmOpContext{comm.shm, "rank " + std::to_string(rank) + ": " + op,
                              deadline_after(timeout), timeout};
}

// Submits one op; failures (errors, timeouts) mark the backend broken. `lane` is the
// communicator for collectives, null for send/recv (Note [Executor lanes]).
template <typename Start>
WorkPtr submit(CollectiveBackend* backend, std::string name, std::vector<at::Tensor> outputs,
               std::chrono::milliseconds timeout, std::shared_ptr<detail::Lane> lane, Start start) {
  return Executor::instance().submit(
      "rank " + std::to_string(backend->rank()) + ": " + name, std::move(outputs), std::move(start),
      deadline_after(timeout),
      [backend](const std::string& reason) { backend->mark_broken(reason); }, std::move(lane));
}

// Note [Inline start]: a shared-memory op needs no MPI call, so the calling thread may run
// it itself, saving the two thread hand-offs of the executor (its wake-up, then the
// caller's), ~15-20 us per op here, a fifth of a 1 MiB all_gather. It does so only when no
// other collective of the communicator is in flight (so issue order and data dependencies
// hold, Note [Executor lanes]), for ops up to kInlineMaxBytes, and only for kInlineBudget:
// if the op makes no progress for that long (a peer has not arrived), the rest of it goes to
// the executor, so the call stays asynchronous in effect (it never waits for a peer for
// longer than the budget, so programs that overlap a collective with work a peer needs
// first cannot deadlock).
// TDIST_MPI_SHM_INLINE=0 turns it off (every op goes through the executor).
constexpr int64_t kInlineMaxBytes = int64_t(4) << 20;
constexpr auto kInlineBudget = std::chrono::microseconds(200);

WorkPtr submit_shm(CollectiveBackend* backend, const detail::Communicator& comm,
                   const std::string& name, std::vector<at::Tensor> outputs,
                   std::chrono::milliseconds timeout, int64_t bytes, StartedOp op) {
  std::string description = "rank " + std::to_string(backend->rank()) + ": " + name;
  auto on_failure = [backend](const std::string& reason) { backend->mark_broken(reason); };
  auto start = [op]() mutable { return std::move(op); };
  detail::Lane& lane = *comm.lane;
  const bool inline_start = comm.env.inline_start && bytes <= kInlineMaxBytes &&
                            lane.in_flight.load() == 0 && !lane.inline_active.exchange(true);
  if (inline_start && lane.in_flight.load() != 0) {
    lane.inline_active = false;  // another thread submitted meanwhile
  } else if (inline_start) {
    bool done = false;
    try {
      // The budget bounds the time spent waiting for peers, not copying: it restarts
      // whenever the op progresses (a 4 MiB op copies for longer than the budget).
      auto until = Executor::Clock::now() + kInlineBudget;
      while (true) {
        bool progressed = false;
        if ((done = op.poll(progressed))) break;
        const auto now = Executor::Clock::now();
        if (progressed) until = now + kInlineBudget;
        if (now >= until) break;
        std::this_thread::yield();
      }
      if (done && op.on_complete) op.on_complete();
    } catch (const std::exception& e) {
      lane.inline_active = false;
      on_failure(e.what());
      auto work = std::make_shared<Work>(description, std::move(outputs));
      work->finish_with_error(std::current_exception());
      return work;
    }
    if (done) {
      lane.inline_active = false;
      auto work = std::make_shared<Work>(description, std::move(outputs));
      work->finish();
      return work;
    }
    // A peer is late: the executor finishes the op (counted in flight before the lane is
    // released, so no later op overtakes it).
    auto work = Executor::instance().submit(std::move(description), std::move(outputs), start,
                                            deadline_after(timeout), on_failure, comm.lane);
    lane.inline_active = false;
    return work;
  }
  return Executor::instance().submit(std::move(description), std::move(outputs), start,
                                     deadline_after(timeout), on_failure, comm.lane);
}

}  // namespace

WorkPtr MPIBackend::broadcast(at::Tensor& tensor, const BroadcastOptions& opts) {
  check_not_broken("broadcast");
  check_root(opts.root, size_, "broadcast");
  StagedBuffer b = staged_buffer(tensor, false, "broadcast");
  MPI_Comm comm = comm_->comm;
  const int root = opts.root;
  return submit(this, "broadcast", {tensor}, deadline_for(opts), comm_->lane, [=] {
    return one_request(
        "MPI_Ibcast",
        [&](MPI_Request* r) { return MPI_Ibcast(b.data(), b.count, b.type, root, comm, r); },
        [staged = b.staged] { staged.copy_back(); });
  });
}

WorkPtr MPIBackend::all_reduce(at::Tensor& tensor, const AllreduceOptions& opts) {
  check_not_broken("all_reduce");
  MPI_Op op = detail::mpi_op(opts.op, tensor.scalar_type());
  StagedBuffer b = staged_buffer(tensor, true, "all_reduce");
  const at::Tensor& buffer = b.staged.buffer;
  auto finish = finish_reduction(b.staged, opts.op == ReduceOp::AVG, size_);
  if (detail::use_shm(comm_->shm.get(), buffer.nbytes(), buffer.scalar_type(), true, opts.op)) {
    auto ctx = shm_context(*comm_, rank_, "all_reduce", deadline_for(opts));
    auto shm_op = detail::shm_all_reduce(ctx, buffer, opts.op, finish);
    return submit_shm(this, *comm_, "all_reduce", {tensor}, deadline_for(opts), buffer.nbytes(),
                      std::move(shm_op));
  }
  if (detail::use_direct(comm_->env.direct_min_bytes, size_, buffer.nbytes(), buffer.scalar_type(),
                         true, opts.op)) {
    auto direct = comm_->direct(rank_, size_);
    const ReduceOp reduce_op = opts.op;
    return submit(this, "all_reduce", {tensor}, deadline_for(opts), comm_->lane, [=] {
      return detail::direct_all_reduce(direct, buffer, reduce_op, detail::take_tag(direct), finish);
    });
  }
  MPI_Comm comm = comm_->comm;
  return submit(this, "all_reduce", {tensor}, deadline_for(opts), comm_->lane, [=] {
    return one_request(
        "MPI_Iallreduce",
        [&](MPI_Request* r) {
          return MPI_Iallreduce(MPI_IN_PLACE, b.data(), b.count, b.type, op, comm, r);
        },
        finish);
  });
}

WorkPtr MPIBackend::all_reduce_coalesced(std::vector<at::Tensor>& tensors,
                                         const AllreduceOptions& opts) {
  check_not_broken("all_reduce_coalesced");
  TDIST_CHECK_ARG(!tensors.empty(), "mpi: all_reduce_coalesced needs at least one tensor");
  for (const auto& t : tensors) check_same_dtype(t, tensors.front(), "all_reduce_coalesced");
  std::vector<at::Tensor> flat_parts;
  for (const auto& t : tensors) flat_parts.push_back(t.reshape({-1}));
  at::Tensor flat = at::cat(flat_parts);
  AllreduceOptions inner = opts;
  auto work = all_reduce(flat, inner);
  // Split back once reduced; the returned Work completes after the copy.
  auto result = std::make_shared<Work>("all_reduce_coalesced", tensors);
  std::vector<at::Tensor> outputs = tensors;
  work->then([result, flat, outputs](Work& w) {
    if (auto error = w.exception()) {
      result->finish_with_error(error);
      return;
    }
    int64_t offset = 0;
    for (const auto& t : outputs) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
    result->finish();
  });
  return result;
}

WorkPtr MPIBackend::reduce(at::Tensor& tensor, const ReduceOptions& opts) {
  check_not_broken("reduce");
  check_root(opts.root, size_, "reduce");
  MPI_Op op = detail::mpi_op(opts.op, tensor.scalar_type());
  StagedBuffer b = staged_buffer(tensor, true, "reduce");
  MPI_Comm comm = comm_->comm;
  const bool is_root = rank_ == opts.root;
  const int root = opts.root;
  // Only the root receives the result.
  std::function<void()> finish = [staged = b.staged] {};
  if (is_root) finish = finish_reduction(b.staged, opts.op == ReduceOp::AVG, size_);
  return submit(this, "reduce", {tensor}, deadline_for(opts), comm_->lane, [=] {
    return one_request(
        "MPI_Ireduce",
        [&](MPI_Request* r) {
          return MPI_Ireduce(is_root ? MPI_IN_PLACE : b.data(), is_root ? b.data() : nullptr,
                             b.count, b.type, op, root, comm, r);
        },
        finish);
  });
}

WorkPtr MPIBackend::all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                                           const AllgatherOptions& opts) {
  check_not_broken("all_gather_into_tensor");
  check_same_dtype(input, output, "all_gather_into_tensor");
  TDIST_CHECK_ARG(output.numel() == input.numel() * size_,
                  "mpi: all_gather_into_tensor: output has " + std::to_string(output.numel()) +
                      " elements, expected input's " + std::to_string(input.numel()) +
                      " x world size " + std::to_string(size_));
  Staged in = stage(input, false);
  Staged out = stage(output, false);
  checked_count(out.buffer.numel(), "all_gather_into_tensor");
  if (detail::use_shm(comm_->shm.get(), out.buffer.nbytes(), out.buffer.scalar_type(), false,
                      ReduceOp::SUM)) {
    auto ctx = shm_context(*comm_, rank_, "all_gather_into_tensor", deadline_for(opts));
    auto op = detail::shm_all_gather(ctx, in.buffer, out.buffer, [out, in] { out.copy_back(); });
    return submit_shm(this, *comm_, "all_gather_into_tensor", {output}, deadline_for(opts),
                      out.buffer.nbytes(), std::move(op));
  }
  return gather_off_shm(
      in.buffer, out.buffer, {output}, [out, in] { out.copy_back(); }, opts);
}

// Note [Placed all-gather] (tdist/detail/comm/placed_all_gather.h): the same collective as
// all_gather_into_tensor (the same name, sizes and path choice on every rank), so ranks may
// mix the two. Over shared memory the blocks go to `place` as the op reads them; elsewhere
// they are gathered rank-major into a scratch buffer and placed from it.
WorkPtr MPIBackend::all_gather_placed(const at::Tensor& input, BlockPlacer place,
                                      const AllgatherOptions& opts) {
  check_not_broken("all_gather_into_tensor");
  Staged in = stage(input, false);
  const int64_t out_bytes = static_cast<int64_t>(in.buffer.nbytes()) * size_;
  checked_count(in.buffer.numel() * size_, "all_gather_into_tensor");
  if (detail::use_shm(comm_->shm.get(), out_bytes, in.buffer.scalar_type(), false, ReduceOp::SUM)) {
    auto ctx = shm_context(*comm_, rank_, "all_gather_into_tensor", deadline_for(opts));
    auto op = detail::shm_all_gather_placed(ctx, in.buffer, std::move(place), [in] {});
    return submit_shm(this, *comm_, "all_gather_into_tensor", {}, deadline_for(opts), out_bytes,
                      std::move(op));
  }
  at::Tensor gathered = at::empty({in.buffer.numel() * size_}, in.buffer.options());
  const size_t block = in.buffer.nbytes();
  const int n = size_;
  return gather_off_shm(
      in.buffer, gathered, {},
      [in, gathered, block, n, place = std::move(place)] {
        const char* all = static_cast<const char*>(gathered.data_ptr());
        for (int c = 0; c < n; ++c) place(c, all + c * block);
      },
      opts);
}

WorkPtr MPIBackend::gather_off_shm(const at::Tensor& in, const at::Tensor& out,
                                   std::vector<at::Tensor> outputs, std::function<void()> finally,
                                   const AllgatherOptions& opts) {
  const int count = checked_count(in.numel(), "all_gather_into_tensor");
  if (detail::use_direct(comm_->env.direct_min_bytes, size_, out.nbytes(), out.scalar_type(), false,
                         ReduceOp::SUM)) {
    auto direct = comm_->direct(rank_, size_);
    return submit(
        this, "all_gather_into_tensor", std::move(outputs), deadline_for(opts), comm_->lane, [=] {
          return detail::direct_all_gather(direct, in, out, detail::take_tag(direct), finally);
        });
  }
  MPI_Datatype type = detail::mpi_datatype(in.scalar_type());
  MPI_Comm comm = comm_->comm;
  return submit(this, "all_gather_into_tensor", std::move(outputs), deadline_for(opts), comm_->lane,
                [=] {
                  return one_request(
                      "MPI_Iallgather",
                      [&](MPI_Request* r) {
                        return MPI_Iallgather(in.data_ptr(), count, type, out.data_ptr(), count,
                                              type, comm, r);
                      },
                      finally);
                });
}

WorkPtr MPIBackend::all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                               const AllgatherOptions& opts) {
  TDIST_CHECK_ARG(static_cast<int>(outputs.size()) == size_,
                  "mpi: all_gather needs " + std::to_string(size_) + " output tensors, got " +
                      std::to_string(outputs.size()));
  for (const auto& o : outputs) {
    check_same_dtype(input, o, "all_gather");
    TDIST_CHECK_ARG(o.numel() == input.numel(),
                    "mpi: all_gather: every output must have the "
                    "input's number of elements");
  }
  at::Tensor flat = at::empty({input.numel() * size_}, input.options());
  auto work = all_gather_into_tensor(flat, input, opts);
  auto result = std::make_shared<Work>("all_gather", outputs);
  std::vector<at::Tensor> outs = outputs;
  const int64_t n = input.numel();
  work->then([result, flat, outs, n](Work& w) {
    if (auto error = w.exception()) return result->finish_with_error(error);
    for (size_t r = 0; r < outs.size(); ++r) {
      outs[r].copy_(flat.narrow(0, r * n, n).view(outs[r].sizes()));
    }
    result->finish();
  });
  return result;
}

WorkPtr MPIBackend::gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                           const GatherOptions& opts) {
  check_not_broken("gather");
  check_root(opts.root, size_, "gather");
  const bool is_root = rank_ == opts.root;
  if (is_root) {
    TDIST_CHECK_ARG(static_cast<int>(outputs.size()) == size_,
                    "mpi: gather: the root needs " + std::to_string(size_) +
                        " output tensors, got " + std::to_string(outputs.size()));
    for (const auto& o : outputs) {
      check_same_dtype(input, o, "gather");
      TDIST_CHECK_ARG(o.numel() == input.numel(), "mpi: gather: output size differs from input");
    }
  }
  StagedBuffer in = staged_buffer(input, false, "gather");
  at::Tensor flat = is_root ? at::empty({input.numel() * size_}, input.options()) : at::Tensor();
  MPI_Comm comm = comm_->comm;
  const int root = opts.root;
  std::vector<at::Tensor> outs = outputs;
  return submit(this, "gather", outputs, deadline_for(opts), comm_->lane, [=] {
    const int count = in.count;
    return one_request(
        "MPI_Igather",
        [&](MPI_Request* r) {
          return MPI_Igather(in.data(), count, in.type, is_root ? flat.data_ptr() : nullptr, count,
                             in.type, root, comm, r);
        },
        [flat, outs, count, staged = in.staged] {
          for (size_t i = 0; i < outs.size(); ++i) {
            outs[i].copy_(flat.narrow(0, i * count, count).view(outs[i].sizes()));
          }
        });
  });
}

WorkPtr MPIBackend::scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                            const ScatterOptions& opts) {
  check_not_broken("scatter");
  check_root(opts.root, size_, "scatter");
  const bool is_root = rank_ == opts.root;
  at::Tensor flat;
  if (is_root) {
    TDIST_CHECK_ARG(static_cast<int>(inputs.size()) == size_,
                    "mpi: scatter: the root needs " + std::to_string(size_) +
                        " input tensors, got " + std::to_string(inputs.size()));
    std::vector<at::Tensor> parts;
    for (const auto& t : inputs) {
      check_same_dtype(t, output, "scatter");
      TDIST_CHECK_ARG(t.numel() == output.numel(), "mpi: scatter: input size differs from output");
      parts.push_back(t.reshape({-1}));
    }
    flat = at::cat(parts);
  }
  StagedBuffer out = staged_buffer(output, false, "scatter");
  MPI_Comm comm = comm_->comm;
  const int root = opts.root;
  return submit(this, "scatter", {output}, deadline_for(opts), comm_->lane, [=] {
    return one_request(
        "MPI_Iscatter",
        [&](MPI_Request* r) {
          return MPI_Iscatter(is_root ? flat.data_ptr() : nullptr, out.count, out.type, out.data(),
                              out.count, out.type, root, comm, r);
        },
        [staged = out.staged, flat] { staged.copy_back(); });
  });
}

WorkPtr MPIBackend::reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                                          const ReduceScatterOptions& opts) {
  check_not_broken("reduce_scatter_tensor");
  check_same_dtype(input, output, "reduce_scatter_tensor");
  TDIST_CHECK_ARG(input.numel() == output.numel() * size_,
                  "mpi: reduce_scatter_tensor: input has " + std::to_string(input.numel()) +
                      " elements, expected output's " + std::to_string(output.numel()) +
                      " x world size " + std::to_string(size_));
  MPI_Op op = detail::mpi_op(opts.op, input.scalar_type());
  StagedBuffer in = staged_buffer(input, true, "reduce_scatter_tensor");
  StagedBuffer out = staged_buffer(output, true, "reduce_scatter_tensor");
  const at::Tensor& in_buffer = in.staged.buffer;
  const at::Tensor& out_buffer = out.staged.buffer;
  auto reduced = finish_reduction(out.staged, opts.op == ReduceOp::AVG, size_);
  auto finish = [reduced, staged_in = in.staged] { reduced(); };  // the input lives until then
  if (detail::use_shm(comm_->shm.get(), in_buffer.nbytes(), in_buffer.scalar_type(), true,
                      opts.op)) {
    auto ctx = shm_context(*comm_, rank_, "reduce_scatter_tensor", deadline_for(opts));
    auto shm_op = detail::shm_reduce_scatter(ctx, in_buffer, out_buffer, opts.op, finish);
    return submit_shm(this, *comm_, "reduce_scatter_tensor", {output}, deadline_for(opts),
                      in_buffer.nbytes(), std::move(shm_op));
  }
  if (detail::use_direct(comm_->env.direct_min_bytes, size_, in_buffer.nbytes(),
                         in_buffer.scalar_type(), true, opts.op)) {
    auto direct = comm_->direct(rank_, size_);
    const ReduceOp reduce_op = opts.op;
    return submit(this, "reduce_scatter_tensor", {output}, deadline_for(opts), comm_->lane, [=] {
      return detail::direct_reduce_scatter(direct, in_buffer, out_buffer, reduce_op,
                                           detail::take_tag(direct), reduced);
    });
  }
  MPI_Comm comm = comm_->comm;
  return submit(this, "reduce_scatter_tensor", {output}, deadline_for(opts), comm_->lane, [=] {
    return one_request(
        "MPI_Ireduce_scatter_block",
        [&](MPI_Request* r) {
          return MPI_Ireduce_scatter_block(in.data(), out.data(), out.count, out.type, op, comm, r);
        },
        finish);
  });
}

WorkPtr MPIBackend::reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                   const ReduceScatterOptions& opts) {
  TDIST_CHECK_ARG(static_cast<int>(inputs.size()) == size_,
                  "mpi: reduce_scatter needs " + std::to_string(size_) + " input tensors, got " +
                      std::to_string(inputs.size()));
  std::vector<at::Tensor> parts;
  for (const auto& t : inputs) {
    TDIST_CHECK_ARG(t.numel() == output.numel(),
                    "mpi: reduce_scatter: every input must have the output's size");
    parts.push_back(t.reshape({-1}));
  }
  at::Tensor flat = at::cat(parts);
  return reduce_scatter_tensor(output, flat, opts);
}

WorkPtr MPIBackend::all_to_all_single(at::Tensor& output, const at::Tensor& input,
                                      const std::vector<int64_t>& output_split_sizes,
                                      const std::vector<int64_t>& input_split_sizes,
                                      const AllToAllOptions& opts) {
  check_not_broken("all_to_all_single");
  check_same_dtype(input, output, "all_to_all_single");
  auto counts_of = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const int64_t row_numel = rows == 0 ? 0 : t.numel() / rows;
    std::vector<int> counts(size_), displs(size_);
    if (splits.empty()) {
      TDIST_CHECK_ARG(rows % size_ == 0, std::string("mpi: all_to_all_single: ") + which +
                                             " dim 0 (" + std::to_string(rows) +
                                             ") is not divisible by the world size; give "
                                             "split sizes");
      for (int r = 0; r < size_; ++r) counts[r] = checked_count(rows / size_ * row_numel, which);
    } else {
      TDIST_CHECK_ARG(static_cast<int>(splits.size()) == size_,
                      std::string("mpi: all_to_all_single: ") + which + " split sizes need " +
                          std::to_string(size_) + " entries");
      int64_t total = 0;
      for (int r = 0; r < size_; ++r) {
        TDIST_CHECK_ARG(splits[r] >= 0, "mpi: all_to_all_single: negative split size");
        counts[r] = checked_count(splits[r] * row_numel, which);
        total += splits[r];
      }
      TDIST_CHECK_ARG(total == rows, std::string("mpi: all_to_all_single: ") + which +
                                         " split sizes sum to " + std::to_string(total) +
                                         ", but dim 0 is " + std::to_string(rows));
    }
    int offset = 0;
    for (int r = 0; r < size_; ++r) {
      displs[r] = offset;
      offset += counts[r];
    }
    return std::make_pair(counts, displs);
  };
  auto [send_counts, send_displs] = counts_of(input, input_split_sizes, "input");
  auto [recv_counts, recv_displs] = counts_of(output, output_split_sizes, "output");
  Staged in = stage(input, false);
  Staged out = stage(output, false);
  MPI_Datatype type = detail::mpi_datatype(in.buffer.scalar_type());
  MPI_Comm comm = comm_->comm;
  return submit(this, "all_to_all_single", {output}, deadline_for(opts), comm_->lane,
                [=, send_counts = send_counts, send_displs = send_displs, recv_counts = recv_counts,
                 recv_displs = recv_displs] {
                  // MPI reads the count arrays until completion: they live in this
                  // lambda's captures, which the executor keeps until the op completes.
                  return one_request(
                      "MPI_Ialltoallv",
                      [&](MPI_Request* r) {
                        return MPI_Ialltoallv(in.buffer.data_ptr(), send_counts.data(),
                                              send_displs.data(), type, out.buffer.data_ptr(),
                                              recv_counts.data(), recv_displs.data(), type, comm,
                                              r);
                      },
                      [out, in] { out.copy_back(); });
                });
}

WorkPtr MPIBackend::all_to_all(std::vector<at::Tensor>& outputs,
                               const std::vector<at::Tensor>& inputs, const AllToAllOptions& opts) {
  TDIST_CHECK_ARG(
      static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
      "mpi: all_to_all needs " + std::to_string(size_) + " input and output tensors");
  std::vector<at::Tensor> in_parts, out_parts;
  std::vector<int64_t> in_splits, out_splits;
  for (int r = 0; r < size_; ++r) {
    in_parts.push_back(inputs[r].reshape({-1}));
    out_parts.push_back(outputs[r].reshape({-1}));
    in_splits.push_back(inputs[r].numel());
    out_splits.push_back(outputs[r].numel());
  }
  at::Tensor in_flat = at::cat(in_parts);
  at::Tensor out_flat =
      at::empty({std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0})},
                outputs.front().options());
  auto work = all_to_all_single(out_flat, in_flat, out_splits, in_splits, opts);
  auto result = std::make_shared<Work>("all_to_all", outputs);
  std::vector<at::Tensor> outs = outputs;
  work->then([result, out_flat, outs](Work& w) {
    if (auto error = w.exception()) return result->finish_with_error(error);
    int64_t offset = 0;
    for (const auto& o : outs) {
      o.copy_(out_flat.narrow(0, offset, o.numel()).view(o.sizes()));
      offset += o.numel();
    }
    result->finish();
  });
  return result;
}

WorkPtr MPIBackend::barrier(const BarrierOptions& opts) {
  check_not_broken("barrier");
  MPI_Comm comm = comm_->comm;
  return submit(this, "barrier", {}, deadline_for(opts), comm_->lane, [=] {
    return one_request(
        "MPI_Ibarrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm, r); }, nullptr);
  });
}

WorkPtr MPIBackend::send(const at::Tensor& tensor, int dst, const SendRecvOptions& opts) {
  check_not_broken("send");
  check_root(dst, size_, "send (dst)");
  StagedBuffer b = staged_buffer(tensor, false, "send");
  MPI_Comm comm = comm_->comm;
  const int tag = opts.tag_id;
  return submit(this, "send", {}, deadline_for(opts), nullptr, [=] {
    return one_request(
        "MPI_Isend",
        [&](MPI_Request* r) { return MPI_Isend(b.data(), b.count, b.type, dst, tag, comm, r); },
        [staged = b.staged] {});
  });
}

WorkPtr MPIBackend::recv(at::Tensor& tensor, int src, const SendRecvOptions& opts) {
  check_not_broken("recv");
  check_root(src, size_, "recv (src)");
  StagedBuffer b = staged_buffer(tensor, false, "recv");
  MPI_Comm comm = comm_->comm;
  const int tag = opts.tag_id;
  return submit(this, "recv", {tensor}, deadline_for(opts), nullptr, [=] {
    return one_request(
        "MPI_Irecv",
        [&](MPI_Request* r) { return MPI_Irecv(b.data(), b.count, b.type, src, tag, comm, r); },
        [staged = b.staged] { staged.copy_back(); });
  });
}

WorkPtr MPIBackend::recv_anysource(at::Tensor& tensor, const SendRecvOptions& opts) {
  check_not_broken("recv");
  TDIST_CHECK_ARG(size_ > 1, "mpi: rank " + std::to_string(rank_) +
                                 ": a receive from any source in a group of one rank would "
                                 "wait forever");
  StagedBuffer b = staged_buffer(tensor, false, "recv");
  MPI_Comm comm = comm_->comm;
  const int tag = opts.tag_id;
  auto source = std::make_shared<int>(-1);
  WorkPtr work = submit(this, "recv (any source)", {tensor}, deadline_for(opts), nullptr, [=] {
    auto statuses = std::make_shared<std::vector<MPI_Status>>(1);
    StartedOp s = one_request(
        "MPI_Irecv(MPI_ANY_SOURCE)",
        [&](MPI_Request* r) {
          return MPI_Irecv(b.data(), b.count, b.type, MPI_ANY_SOURCE, tag, comm, r);
        },
        [staged = b.staged, statuses, source] {
          *source = (*statuses)[0].MPI_SOURCE;
          staged.copy_back();
        });
    s.statuses = statuses;
    return s;
  });
  // Runs before waiters wake (Work::then), so source_rank() is set once wait() returns.
  work->then([source](Work& w) { w.set_source_rank(*source); });
  return work;
}

}  // namespace tdist::mpi

#include "comm/collective_call.h"

#include <ATen/Functions.h>

#include "comm/flight_recorder_hooks.h"
#include "comm/state.h"
#include "tdist/error.h"

namespace tdist::detail {

Call::Call(const ProcessGroupPtr& group, std::string op_name)
    : pg(resolve_group(group, op_name)), op(std::move(op_name)) {}

std::string Call::where() const {
  const WorldState* state = world_state();
  const int rank = pg->is_member()         ? pg->global_rank(pg->rank())
                   : state && state->world ? state->world->rank()
                                           : -1;
  return "rank " + std::to_string(rank) + ": " + op;
}

void Call::check_defined(const at::Tensor& t, const std::string& what) const {
  if (!t.defined()) TDIST_THROW(InvalidArgument, where() + ": " + what + " is undefined");
}

void Call::check_output(const at::Tensor& t, const std::string& what) const {
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

at::Tensor Call::input(const at::Tensor& t, const std::string& what) const {
  check_defined(t, what);
  return (t.is_contiguous() ? t : t.contiguous()).resolve_conj();
}

void Call::check_reduce_op(const at::Tensor& t, const ReduceOp& op) const {
  if (op == ReduceOp::PREMUL_SUM) {
    if (!op.has_factor()) {
      TDIST_THROW(InvalidArgument, where() +
                                       ": ReduceOp PREMUL_SUM needs its factor; pass "
                                       "make_nccl_premul_sum(factor) (a scalar or a "
                                       "one-element tensor), as torch.distributed's "
                                       "_make_nccl_premul_sum");
    }
    const at::ScalarType real =
        t.is_complex() ? c10::toRealValueType(t.scalar_type()) : t.scalar_type();
    if (!at::isFloatingType(real)) {
      TDIST_THROW(InvalidArgument, where() +
                                       ": ReduceOp PREMUL_SUM is defined for float16, "
                                       "bfloat16, float32 and float64 tensors (as "
                                       "PyTorch's NCCL has it), got " +
                                       std::string(c10::toString(t.scalar_type())) +
                                       "; multiply and reduce with SUM instead");
    }
    return;
  }
  if (t.is_complex() && op != ReduceOp::SUM && op != ReduceOp::AVG) {
    TDIST_THROW(InvalidArgument, where() + ": " + to_string(op) +
                                     " is not defined on complex numbers (dtype " +
                                     std::string(c10::toString(t.scalar_type())) +
                                     "); use SUM, AVG or PREMUL_SUM, or reduce a real tensor "
                                     "such as t.abs() or at::view_as_real(t)");
  }
}

void Call::check_like(const at::Tensor& t, const at::Tensor& ref, const std::string& what,
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
                                     " elements but the input has " + std::to_string(ref.numel()));
  }
}

void Call::check_list_size(size_t n, const std::string& what) const {
  if (static_cast<int>(n) != pg->size()) {
    TDIST_THROW(InvalidArgument, where() + ": " + what + " has " + std::to_string(n) +
                                     " tensors but the group has " + std::to_string(pg->size()) +
                                     " ranks; give one per rank");
  }
}

int Call::group_rank_of(int global_rank, const std::string& what) const {
  try {
    return pg->group_rank(global_rank);
  } catch (const InvalidArgument& e) {
    TDIST_THROW(InvalidArgument, where() + ": " + what + " " + e.what());
  }
}

int Call::root_of(std::optional<int> global, std::optional<int> group, const char* global_name,
                  const char* group_name, std::optional<int> fallback) const {
  if (!global && !group) global = fallback;
  if (global && group) {
    TDIST_THROW(InvalidArgument,
                where() + ": both " + global_name + " (" + std::to_string(*global) + ") and " +
                    group_name + " (" + std::to_string(*group) + ") are given; give one: " +
                    global_name + " is a global rank, " + group_name + " a rank of the group");
  }
  if (!global && !group) {
    TDIST_THROW(InvalidArgument, where() + ": neither " + global_name + " nor " + group_name +
                                     " is given; give one: " + global_name + " is a global rank, " +
                                     group_name + " a rank of the group");
  }
  if (skip()) return -1;
  if (global) return group_rank_of(*global, global_name);
  if (*group < 0 || *group >= pg->size()) {
    TDIST_THROW(InvalidArgument, where() + ": " + group_name + " " + std::to_string(*group) +
                                     " is outside process group '" + pg->name() + "' of size " +
                                     std::to_string(pg->size()) + " (group ranks run from 0 to " +
                                     std::to_string(pg->size() - 1) + ")");
  }
  return *group;
}

void Call::debug(const at::Tensor& t, bool check_shape, int root, int reduce_op) const {
  debug_signature(signature_of(op, t, check_shape, root, reduce_op), {t});
}

void Call::debug_signature(const CallSignature& sig, const std::vector<at::Tensor>& tensors) const {
  const uint64_t seq = pg->next_sequence_number();
  if (pg->debug_detail()) check_call_signature(*pg, sig);
  record_id = flight_record_issue(*pg, seq, op, tensors);
}

WorkPtr Call::finish(WorkPtr work, bool async_op) const {
  if (!work) TDIST_THROW(DistBackendError, where() + ": the backend returned no work handle");
  flight_record_track(record_id, pg, work);
  if (async_op) return work;
  // The backend enforces the group timeout itself; this outer bound only guarantees that a
  // misbehaving backend cannot block forever.
  auto bound = pg->timeout() + std::chrono::seconds(5);
  try {
    work->wait(bound);
  } catch (const TimeoutError& e) {
    // The flight recorder's report names the rank that is behind (see flight_recorder.h).
    const std::string report = flight_record_failure(record_id, *pg, std::current_exception());
    TDIST_THROW(TimeoutError, where() + " on process group '" + pg->name() + "' (sequence number " +
                                  std::to_string(pg->sequence_number()) + ") did not complete: " +
                                  e.what() + (report.empty() ? "" : "\n" + report));
  } catch (const Error&) {
    flight_record_failure(record_id, *pg, std::current_exception());
    throw;
  }
  return work;
}

at::Tensor real_view(const at::Tensor& t) {
  return t.is_complex() ? at::view_as_real(t) : t;
}

std::vector<at::Tensor> real_views(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> views;
  views.reserve(tensors.size());
  for (const auto& t : tensors) views.push_back(real_view(t));
  return views;
}

}  // namespace tdist::detail

#pragma once

// Internal: what every collective free function of distributed.h does before it reaches a
// backend (collectives.cpp, point_to_point.cpp): resolve the group, name the call in
// messages, check its tensors, turn src/dst or group_src/group_dst into a group rank, number
// it for the TDIST_DEBUG=DETAIL check and the flight recorder, and wait unless async_op.

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/debug_check.h"
#include "tdist/comm/process_group.h"
#include "tdist/comm/types.h"
#include "tdist/comm/work.h"

namespace tdist::detail {

/// Per-call context: the resolved group and the op name used in every message.
struct Call {
  ProcessGroupPtr pg;
  std::string op;
  mutable uint64_t record_id = 0;  // the flight recorder's record of this call (0: none)

  Call(const ProcessGroupPtr& group, std::string op_name);

  /// torch.distributed semantics: a non-member's collective is a no-op.
  bool skip() const { return !pg->is_member(); }

  /// "rank <this process's global rank>: <op>", members and non-members alike.
  std::string where() const;

  void check_defined(const at::Tensor& t, const std::string& what) const;
  /// Tensors the collective writes must be contiguous and need no lazy conjugation: a copy
  /// would not reach the caller.
  void check_output(const at::Tensor& t, const std::string& what) const;
  /// Read-only tensors are made contiguous (and lazy conjugates resolved) silently.
  at::Tensor input(const at::Tensor& t, const std::string& what) const;
  /// See Note [Complex tensors]; PREMUL_SUM's factor and dtypes (Note [PREMUL_SUM without
  /// NCCL]).
  void check_reduce_op(const at::Tensor& t, const ReduceOp& op) const;
  void check_like(const at::Tensor& t, const at::Tensor& ref, const std::string& what,
                  bool same_numel) const;
  void check_list_size(size_t n, const std::string& what) const;
  int group_rank_of(int global_rank, const std::string& what) const;
  /// The group rank a rooted call names, as torch.distributed's _canonicalize_group_rank:
  /// exactly one of `global` (named `global_name`, e.g. "src") and `group` ("group_src").
  /// `fallback`, when given, is the global rank used when neither is (gather and scatter
  /// default to global rank 0). The one-of rule holds on every rank; a non-member gets -1.
  int root_of(std::optional<int> global, std::optional<int> group, const char* global_name,
              const char* group_name, std::optional<int> fallback = std::nullopt) const;

  template <typename Options>
  Options options() const {
    Options opts;
    opts.timeout = pg->timeout();
    return opts;
  }

  void debug(const at::Tensor& t, bool check_shape = true, int root = -1, int reduce_op = -1) const;
  /// Numbers the call, checks it across ranks (debug mode) and records it.
  void debug_signature(const CallSignature& sig, const std::vector<at::Tensor>& tensors) const;

  /// Tracks `work` in the flight recorder; unless async_op, waits for it (bounded by the
  /// group's timeout) and turns a timeout into the recorder's report.
  WorkPtr finish(WorkPtr work, bool async_op) const;
};

// Note [Complex tensors]: as in torch.distributed, a complex tensor travels as its real view
// (at::view_as_real: the same memory as [..., 2] of the real dtype), so every backend carries
// it without knowing complex dtypes. The sum and the average of complex numbers are those of
// their real and imaginary parts; MIN, MAX, PRODUCT and the bitwise ops are not, so they are
// refused (Call::check_reduce_op) rather than computed part by part. torch.distributed views
// complex tensors as real in most collectives but not in reduce, gather or reduce-scatter,
// which then fail in the backend; here every collective takes them. The cross-rank check and
// the flight recorder see the caller's complex tensors; only the backend sees the views.
at::Tensor real_view(const at::Tensor& t);
std::vector<at::Tensor> real_views(const std::vector<at::Tensor>& tensors);

}  // namespace tdist::detail

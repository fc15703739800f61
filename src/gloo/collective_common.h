#pragma once

// Helpers shared by the collective families: argument checks and staging of tensors into
// contiguous working buffers (Note [Staging]).
//
// Note [Staging]: the algorithms work on contiguous memory in the accumulation dtype. A
// contiguous tensor of the right dtype is used in place; anything else (non-contiguous,
// float16/bfloat16 in a reduction) goes through a working copy that is copied back into the
// caller's tensor at the end.

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "gloo/exchange.h"
#include "gloo/reduce_ops.h"
#include "tdist/error.h"

namespace tdist::detail {

inline std::string rank_prefix(int rank, const std::string& op) {
  return "rank " + std::to_string(rank) + ": gloo " + op + ": ";
}

/// Defined, dense, CPU, of a carried dtype.
inline void check_tensor(const at::Tensor& t, const std::string& op, int rank,
                         const std::string& name) {
  TDIST_CHECK_ARG(t.defined(), rank_prefix(rank, op) + name + " is an undefined tensor");
  TDIST_CHECK_ARG(t.device().is_cpu() && t.layout() == at::kStrided,
                  rank_prefix(rank, op) + name + " must be a dense CPU tensor, got " +
                      t.device().str() + "; move it with .cpu() or use a backend for its device");
  check_gloo_dtype(t.scalar_type(), op, rank);
}

inline void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const std::string& op,
                             int rank, const std::string& what) {
  TDIST_CHECK_ARG(a.scalar_type() == b.scalar_type(),
                  rank_prefix(rank, op) + what +
                      " dtypes differ: " + std::string(c10::toString(a.scalar_type())) + " vs " +
                      std::string(c10::toString(b.scalar_type())) + "; use the same dtype");
}

inline void check_root(int root, int size, const std::string& op, int rank) {
  TDIST_CHECK_ARG(root >= 0 && root < size, rank_prefix(rank, op) + "root " + std::to_string(root) +
                                                " is outside the group [0, " +
                                                std::to_string(size) + ")");
}

/// A per-rank tensor list (all_gather's and gather's outputs, scatter's inputs) against the
/// single tensor on the other side: one per rank, each valid, of the same dtype and element
/// count. `list` names the list's elements ("output"/"input"), `single` the other tensor;
/// `who` prefixes the count message ("the root " where only the root passes a list).
inline void check_per_rank_list(const std::vector<at::Tensor>& tensors, const at::Tensor& other,
                                const std::string& op, int rank, int size, const std::string& list,
                                const std::string& single, const std::string& who = "") {
  TDIST_CHECK_ARG(static_cast<int>(tensors.size()) == size,
                  rank_prefix(rank, op) + who + "needs one " + list + " per rank (" +
                      std::to_string(size) + "), got " + std::to_string(tensors.size()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string name = list + "s[" + std::to_string(i) + "]";
    check_tensor(tensors[i], op, rank, name);
    check_same_dtype(tensors[i], other, op, rank, name + " and " + single);
    TDIST_CHECK_ARG(tensors[i].numel() == other.numel(),
                    rank_prefix(rank, op) + name + " has " + std::to_string(tensors[i].numel()) +
                        " elements but " + single + " has " + std::to_string(other.numel()));
  }
}

/// Contiguous tensor of dtype `dtype` with t's values; t itself when it already is one.
inline at::Tensor staged(const at::Tensor& t, at::ScalarType dtype) {
  if (t.is_contiguous() && t.scalar_type() == dtype) return t;
  return t.contiguous().to(dtype).contiguous();
}

/// Contiguous output buffer for t (t itself when contiguous and of dtype `dtype`).
inline at::Tensor staged_output(const at::Tensor& t, at::ScalarType dtype) {
  if (t.is_contiguous() && t.scalar_type() == dtype) return t;
  return at::empty(t.sizes(), t.options().dtype(dtype).memory_format(at::MemoryFormat::Contiguous));
}

inline void unstage(at::Tensor& user, const at::Tensor& work) {
  if (!work.is_same(user)) user.copy_(work.view(user.sizes()));
}

inline char* bytes_of(const at::Tensor& t) {
  return static_cast<char*>(t.data_ptr());
}

inline OpInfo start_op(GlooComm& comm, const std::string& op, std::chrono::milliseconds timeout) {
  OpInfo info;
  info.op = op;
  info.seq = comm.next_seq();
  info.timeout = timeout;
  info.deadline = Clock::now() + timeout;
  return info;
}

inline Header header_for(const at::Tensor& t, int64_t total, int reduce_op = -1, int root = -1) {
  Header h;
  h.dtype = static_cast<int32_t>(t.scalar_type());
  h.total = total;
  h.reduce_op = reduce_op;
  h.root = root;
  return h;
}

// Key bases that keep the phases of one collective on distinct slots.
constexpr uint64_t kPhase1 = 0;
constexpr uint64_t kPhase2 = uint64_t(1) << 28;
/// Key base of a direct transfer from rank `src` (segments follow).
inline uint64_t from_rank(int src) {
  return (uint64_t(2) << 28) + (uint64_t(src) << 20);
}

}  // namespace tdist::detail

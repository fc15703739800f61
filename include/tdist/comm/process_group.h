#pragma once

// A group of ranks that run collectives together. A ProcessGroup owns one CollectiveBackend
// per device type ("cpu:gloo,cuda:nccl") and routes each call by the tensor's device.

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/comm/collective_backend.h"
#include "tdist/store/store.h"

namespace tdist {

class ProcessGroup {
 public:
  /// `global_ranks[i]` is the global rank of group rank i. `rank` is this process's group
  /// rank, or -1 when it is not a member (then every collective throws).
  ProcessGroup(std::string name, StorePtr store, int rank, std::vector<int> global_ranks,
               std::chrono::milliseconds timeout);

  const std::string& name() const { return name_; }
  /// What the group is for, as c10d's group_desc: "default_pg" for the world, "undefined"
  /// for new_group's, "<parent's>:split:<n>" for split_group's unless given.
  const std::string& group_desc() const { return group_desc_; }
  void set_group_desc(std::string desc) { group_desc_ = std::move(desc); }
  /// This process's rank in the group; -1 for a non-member.
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  bool is_member() const { return rank_ >= 0; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  int group_rank(int global_rank) const;  // throws InvalidArgument if not in group
  int global_rank(int group_rank) const;  // throws InvalidArgument if out of range
  std::chrono::milliseconds timeout() const { return timeout_; }
  const StorePtr& store() const { return store_; }
  /// Backend names per device type, e.g. {"cpu": "gloo"}.
  std::map<std::string, std::string> backend_names() const;

  /// Drops every backend (destroy_process_group); later collectives fail naming the group.
  void release_backends();
  bool is_destroyed() const { return destroyed_; }

  void set_backend(const std::string& device_type, const std::string& backend_name,
                   CollectiveBackendPtr backend);
  /// The backend for tensors on `device_type`; throws naming the device and the
  /// configured backends when none is set.
  CollectiveBackend& backend(const std::string& device_type) const;
  CollectiveBackend& backend_for(const at::Tensor& tensor) const;
  /// The backend used for device-less ops (barrier): the cpu one if any, else the first.
  CollectiveBackend& default_backend() const;
  /// Where the group exchanges control values (flags, counts, object bytes), as c10d's
  /// _get_pg_default_device: the CPU when it has a CPU backend, else the current device of
  /// its device backend (a group of nccl alone: this rank's GPU).
  c10::Device default_device() const;

  /// Monotonic per-group sequence number of collectives issued (for diagnostics).
  uint64_t next_sequence_number() { return ++sequence_number_; }
  uint64_t sequence_number() const { return sequence_number_; }
  /// Counter of store-based operations (monitored_barrier), the same on every member.
  uint64_t next_store_op_id() { return ++store_op_id_; }
  /// Counter of split_group calls on this group (every member calls each), for the new
  /// groups' names and descriptions.
  int next_split_id() { return ++split_count_; }

  /// TDIST_DEBUG=DETAIL: check op, shapes and dtypes across ranks before each collective.
  bool debug_detail() const { return debug_detail_; }
  void set_debug_detail(bool on) { debug_detail_ = on; }

 private:
  std::string name_;
  std::string group_desc_;
  StorePtr store_;
  int rank_;
  std::vector<int> global_ranks_;
  std::chrono::milliseconds timeout_;
  std::map<std::string, std::pair<std::string, CollectiveBackendPtr>> backends_;
  uint64_t sequence_number_ = 0;
  uint64_t store_op_id_ = 0;
  int split_count_ = 0;
  bool debug_detail_ = false;
  bool destroyed_ = false;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

}  // namespace tdist

#pragma once

// The torch.distributed surface: initialisation, groups and every collective.
// Ranks given as src/dst are *global* ranks, as in torch.distributed; the group_src/group_dst
// forms take a rank of `group` instead. Exactly one of the two may be given (both, or
// neither where there is no default, is InvalidArgument naming both). A null group means the
// default (world) group. Every collective returns its Work: with async_op=false it has
// already completed (and thrown on error) when the call returns.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/arg.h"
#include "tdist/comm/backend.h"
#include "tdist/comm/process_group.h"
#include "tdist/comm/types.h"
#include "tdist/comm/work.h"
#include "tdist/store/store.h"

namespace tdist {

/// Default collective timeout: 30 minutes (10 for nccl), as torch.distributed.
constexpr std::chrono::milliseconds kDefaultPgTimeout{std::chrono::minutes(30)};
constexpr std::chrono::milliseconds kDefaultNCCLTimeout{std::chrono::minutes(10)};

bool is_available();
bool is_initialized();
bool is_gloo_available();
bool is_mpi_available();
bool is_nccl_available();
bool is_xccl_available();
/// True when started by tdistrun (TORCHELASTIC_RUN_ID is set).
bool is_torchelastic_launched();
/// Whether every backend `backend` names is built and registered: one name ("gloo") or a
/// device list ("cpu:gloo,cuda:nccl"), as torch.distributed.is_backend_available.
bool is_backend_available(const std::string& backend);
/// This process's rank on its machine: LOCAL_RANK (set by tdistrun and torchrun), else
/// `fallback_rank`, else InvalidArgument; as torch.distributed.get_node_local_rank.
int get_node_local_rank(std::optional<int> fallback_rank = std::nullopt);
/// "cpu" -> "gloo", "cuda" -> "nccl"; throws for device types no backend serves.
std::string get_default_backend_for_device(const std::string& device);

/// Arguments of init_process_group. Give either an init_method URL (env:// when neither it
/// nor a store is given; tcp://host:port; file:///path, each accepting ?rank=&world_size=),
/// or a store with rank and world_size.
struct InitProcessGroupOptions {
  /// "gloo", "mpi", "nccl", a registered name, or "cpu:gloo,cuda:nccl". Empty: the default
  /// backend of every device type this build supports.
  TDIST_ARG(std::string, backend) = "";
  TDIST_ARG(std::string, init_method) = "";
  /// Collective timeout; zero means the backend's default (30 min, 10 for nccl).
  TDIST_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
  TDIST_ARG(int, world_size) = -1;
  TDIST_ARG(int, rank) = -1;
  TDIST_ARG(StorePtr, store) = nullptr;
  /// Deprecated in torch.distributed; accepted and ignored.
  TDIST_ARG(std::string, group_name) = "";
  /// Device this process uses ("cpu", "cuda:1"); recorded, used to pick default backends.
  TDIST_ARG(std::string, device_id) = "";
};

/// Blocks until all world_size processes have joined. Not thread-safe.
void init_process_group(const InitProcessGroupOptions& options = {});
/// Destroys `group`, or every group and the default one when null.
void destroy_process_group(const ProcessGroupPtr& group = nullptr);

/// The default (world) group; throws if not initialised.
ProcessGroupPtr group_world();
/// Where `group` (default: the world) exchanges control values: ProcessGroup::default_device.
/// The library's own flags and counts go there, so a group of nccl alone serves them.
c10::Device get_default_device(const ProcessGroupPtr& group = nullptr);
/// `t` itself when `group` has a backend for its device type, else a copy on the group's
/// default device: for small host-made tensors (flags, counts) in any group, nccl-only too.
at::Tensor to_collective_device(const at::Tensor& t, const ProcessGroupPtr& group = nullptr);

struct NewGroupOptions {
  TDIST_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
  TDIST_ARG(std::string, backend) = "";
};
/// Every rank of the world must call new_group with the same ranks, in the same order of
/// calls. Non-members receive a group with is_member() == false. Empty ranks: all ranks.
ProcessGroupPtr new_group(std::vector<int> ranks = {}, const NewGroupOptions& options = {});

/// The global ranks of `group` (default: the world) in group-rank order, as
/// torch.distributed.get_process_group_ranks; a rank outside the group may ask too.
std::vector<int> get_process_group_ranks(const ProcessGroupPtr& group = nullptr);

/// What new_subgroups returns, as torch.distributed's (cur_subgroup, subgroups) pair:
/// `current` is this rank's subgroup (null when it is in none), `all` every subgroup in order.
struct Subgroups {
  ProcessGroupPtr current;
  std::vector<ProcessGroupPtr> all;
};
/// As torch.distributed.new_subgroups: splits `group` (default: the world) into subgroups of
/// `group_size` consecutive group ranks. group_size 0: the number of CUDA devices on this
/// machine (one subgroup per machine when every machine runs one rank per GPU). Like
/// new_group, every rank of the world calls it with the same arguments.
Subgroups new_subgroups(int group_size = 0, const ProcessGroupPtr& group = nullptr,
                        const NewGroupOptions& options = {});
/// As torch.distributed.new_subgroups_by_enumeration: one subgroup per list of global ranks.
/// The lists must be non-empty and must not overlap; ranks in none get a null `current`.
Subgroups new_subgroups_by_enumeration(const std::vector<std::vector<int>>& ranks_per_subgroup,
                                       const NewGroupOptions& options = {});

int get_rank(const ProcessGroupPtr& group = nullptr);
int get_world_size(const ProcessGroupPtr& group = nullptr);
int get_group_rank(const ProcessGroupPtr& group, int global_rank);
int get_global_rank(const ProcessGroupPtr& group, int group_rank);
std::string get_backend(const ProcessGroupPtr& group = nullptr);
/// The group's backend per device type, as torch.distributed.get_backend_config:
/// "cpu:gloo,cuda:gloo" for a group made with "gloo", "cpu:gloo,cuda:nccl", "cuda:nccl"
/// (device types in alphabetical order). Throws InvalidArgument on a non-member.
std::string get_backend_config(const ProcessGroupPtr& group = nullptr);

// ---- collectives ------------------------------------------------------------------------

/// The tensor of global rank `src` (or group rank `group_src`) on every member.
WorkPtr broadcast(const at::Tensor& tensor, std::optional<int> src = std::nullopt,
                  const ProcessGroupPtr& group = nullptr, bool async_op = false,
                  std::optional<int> group_src = std::nullopt);
WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::SUM,
                   const ProcessGroupPtr& group = nullptr, bool async_op = false);
WorkPtr all_reduce_coalesced(const std::vector<at::Tensor>& tensors, ReduceOp op = ReduceOp::SUM,
                             const ProcessGroupPtr& group = nullptr, bool async_op = false);
/// The reduction lands on global rank `dst` (or group rank `group_dst`); the other ranks'
/// tensors keep their values.
WorkPtr reduce(const at::Tensor& tensor, std::optional<int> dst = std::nullopt,
               ReduceOp op = ReduceOp::SUM, const ProcessGroupPtr& group = nullptr,
               bool async_op = false, std::optional<int> group_dst = std::nullopt);
WorkPtr all_gather(std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor,
                   const ProcessGroupPtr& group = nullptr, bool async_op = false);
WorkPtr all_gather_into_tensor(const at::Tensor& output_tensor, const at::Tensor& input_tensor,
                               const ProcessGroupPtr& group = nullptr, bool async_op = false);
/// As torch.distributed.all_gather_coalesced: output_tensor_lists[r][i] receives group rank
/// r's input_tensor_list[i], for every i, in one collective. Every member passes inputs of
/// the same count, sizes and dtype (one dtype and device for all); every output list matches
/// the input list.
WorkPtr all_gather_coalesced(std::vector<std::vector<at::Tensor>>& output_tensor_lists,
                             const std::vector<at::Tensor>& input_tensor_list,
                             const ProcessGroupPtr& group = nullptr, bool async_op = false);
/// gather_list is used on the destination only (must be empty elsewhere). Neither dst nor
/// group_dst: global rank 0, as torch.distributed.
WorkPtr gather(const at::Tensor& tensor, std::vector<at::Tensor> gather_list = {},
               std::optional<int> dst = std::nullopt, const ProcessGroupPtr& group = nullptr,
               bool async_op = false, std::optional<int> group_dst = std::nullopt);
/// scatter_list is used on the source only (must be empty elsewhere). Neither src nor
/// group_src: global rank 0, as torch.distributed.
WorkPtr scatter(const at::Tensor& tensor, std::vector<at::Tensor> scatter_list = {},
                std::optional<int> src = std::nullopt, const ProcessGroupPtr& group = nullptr,
                bool async_op = false, std::optional<int> group_src = std::nullopt);
WorkPtr reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& input_list,
                       ReduceOp op = ReduceOp::SUM, const ProcessGroupPtr& group = nullptr,
                       bool async_op = false);
WorkPtr reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                              ReduceOp op = ReduceOp::SUM, const ProcessGroupPtr& group = nullptr,
                              bool async_op = false);
WorkPtr all_to_all(std::vector<at::Tensor>& output_tensor_list,
                   const std::vector<at::Tensor>& input_tensor_list,
                   const ProcessGroupPtr& group = nullptr, bool async_op = false);
WorkPtr all_to_all_single(const at::Tensor& output, const at::Tensor& input,
                          const std::vector<int64_t>& output_split_sizes = {},
                          const std::vector<int64_t>& input_split_sizes = {},
                          const ProcessGroupPtr& group = nullptr, bool async_op = false);
WorkPtr barrier(const ProcessGroupPtr& group = nullptr, bool async_op = false);
/// A barrier that reports which ranks failed to arrive within `timeout` (default: the
/// group's). With wait_all_ranks, rank 0 collects every missing rank before raising.
void monitored_barrier(const ProcessGroupPtr& group = nullptr,
                       std::chrono::milliseconds timeout = kUseGroupTimeout,
                       bool wait_all_ranks = false);

/// To global rank `dst` (or group rank `group_dst`), not this rank itself.
void send(const at::Tensor& tensor, std::optional<int> dst = std::nullopt,
          const ProcessGroupPtr& group = nullptr, int tag = 0,
          std::optional<int> group_dst = std::nullopt);
/// From global rank `src` (or group rank `group_src`), or, with neither, from whichever rank
/// of the group sends first with this tag (gloo and mpi; nccl refuses, as PyTorch's).
/// Returns the sender's global rank; -1 on a rank outside the group.
int recv(const at::Tensor& tensor, std::optional<int> src = std::nullopt,
         const ProcessGroupPtr& group = nullptr, int tag = 0,
         std::optional<int> group_src = std::nullopt);
WorkPtr isend(const at::Tensor& tensor, std::optional<int> dst = std::nullopt,
              const ProcessGroupPtr& group = nullptr, int tag = 0,
              std::optional<int> group_dst = std::nullopt);
/// As recv, asynchronous; from any source, the Work's source_rank() names the sender's group
/// rank once it has completed.
WorkPtr irecv(const at::Tensor& tensor, std::optional<int> src = std::nullopt,
              const ProcessGroupPtr& group = nullptr, int tag = 0,
              std::optional<int> group_src = std::nullopt);

/// One send or receive of batch_isend_irecv, as torch.distributed.P2POp: `op` is isend or
/// irecv; the peer is a global rank (`peer`) or a rank of the group (`group_peer`), exactly
/// one of them. The constructor resolves a null group to the world and keeps both forms.
struct P2POp {
  using Function = WorkPtr (*)(const at::Tensor&, std::optional<int>, const ProcessGroupPtr&, int,
                               std::optional<int>);
  P2POp(Function op, at::Tensor tensor, std::optional<int> peer = std::nullopt,
        ProcessGroupPtr group = nullptr, int tag = 0, std::optional<int> group_peer = std::nullopt);
  Function op;
  at::Tensor tensor;
  int peer = -1;        // global rank
  int group_peer = -1;  // rank in `group`
  ProcessGroupPtr group;
  int tag;
};

/// Issues every op at once (NCCL: one group call, so that ranks exchanging in a ring cannot
/// deadlock); returns one Work per op. All ops use one group.
std::vector<WorkPtr> batch_isend_irecv(const std::vector<P2POp>& ops);

}  // namespace tdist

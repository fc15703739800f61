#pragma once

// Internal: the process-wide state behind the torch.distributed free functions.
// init_process_group is not thread-safe (as in torch.distributed): one thread creates and
// destroys groups; collectives may run from any thread once groups exist.

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/heartbeat.h"
#include "tdist/comm/process_group.h"
#include "tdist/store/store.h"

namespace tdist::detail {

struct WorldState {
  ProcessGroupPtr world;
  StorePtr store;           // the rendezvous store, shared by every group through prefixes
  bool owns_store = false;  // created by init_process_group (then rank 0 may host it)
  std::map<std::string, std::string> backend_spec;  // device type -> backend name
  std::vector<ProcessGroupPtr> groups;              // made by new_group, in creation order
  int group_counter = 0;
  int generation = 0;  // distinguishes successive init_process_group calls
  std::string device_id;
  bool debug_detail = false;
  /// Note [Heartbeats]; null when off. Destroyed before the world, so that its thread stops
  /// and this rank is marked finished before the exit barrier.
  std::unique_ptr<HeartbeatMonitor> heartbeat;
};

/// Null when init_process_group has not run (or the world was destroyed).
WorldState* world_state();

/// The group to use for `op`: `group` or the world. Throws InvalidArgument when
/// init_process_group has not run.
ProcessGroupPtr resolve_group(const ProcessGroupPtr& group, const std::string& op);

/// The key prefix of everything this initialisation keeps in the store.
std::string store_prefix(const WorldState& state);

/// Gives `pg` (a member) a backend per device type of `spec`, created through the registry
/// over `group_store` (one instance per backend name, shared by the device types it serves),
/// except the backends `made` already holds by name (split or shrunk from a parent).
void create_backends(ProcessGroup& pg, const std::map<std::string, std::string>& spec,
                     const StorePtr& group_store, std::chrono::milliseconds timeout,
                     const std::string& device_id,
                     std::map<std::string, CollectiveBackendPtr> made = {});

}  // namespace tdist::detail

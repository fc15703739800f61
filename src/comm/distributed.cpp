// init_process_group, destroy_process_group, groups and the is_* queries.

#include "tdist/comm/distributed.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <set>
#include <thread>

#include <c10/core/impl/VirtualGuardImpl.h>

#include "comm/comm_environment.h"
#include "comm/heartbeat.h"
#include "comm/host_staged_backend.h"
#include "comm/live_backends.h"
#include "comm/rendezvous.h"
#include "comm/state.h"
#include "tdist/comm/launch_environment.h"
#include "tdist/detail/util/env.h"
#include "tdist/detail/util/openblas_core.h"
#include "tdist/error.h"
#include "tdist/store/prefix_store.h"
#include "tdist/store/tcp_store.h"

namespace tdist {

namespace detail {

namespace {
std::unique_ptr<WorldState>& state_slot() {
  static std::unique_ptr<WorldState> state;
  return state;
}
int& init_generation() {
  static int generation = 0;
  return generation;
}

std::chrono::milliseconds default_timeout(const std::map<std::string, std::string>& spec) {
  for (const auto& [device, name] : spec) {
    if (name == Backend::NCCL) return kDefaultNCCLTimeout;
  }
  return kDefaultPgTimeout;
}

std::string spec_text(const std::map<std::string, std::string>& spec) {
  std::set<std::string> names;
  for (const auto& [device, name] : spec) names.insert(name);
  if (names.size() == 1) return *names.begin();
  std::string out;
  for (const auto& [device, name] : spec) out += (out.empty() ? "" : ",") + device + ":" + name;
  return out;
}

/// Note [Heartbeats]: on when TDIST_HEARTBEAT_INTERVAL_MS says so and the world's store is a
/// TCP store (a file or in-process store has no host to lose), over a connection of its own
/// whose requests time out after the silence that makes a peer lost.
std::unique_ptr<HeartbeatMonitor> start_heartbeat(const WorldState& state,
                                                  const CommEnvironment& env, int rank,
                                                  int world_size) {
  const auto* tcp = dynamic_cast<const TCPStore*>(state.store.get());
  if (env.heartbeat_interval.count() == 0 || tcp == nullptr || world_size < 2) return nullptr;
  HeartbeatOptions options;
  options.interval = env.heartbeat_interval;
  options.misses = env.heartbeat_misses;
  options.grace = env.heartbeat_grace;
  TCPStoreOptions connection;
  connection.port(tcp->port())
      .wait_for_workers(false)
      .timeout(options.silence())
      .notice_after(std::chrono::milliseconds(0))
      .client_name("rank " + std::to_string(rank) + " heartbeat")
      .server_name("rank 0");
  if (env.debug_info) {
    std::cerr << "tdist: rank " << rank << ": heartbeats every " << options.interval.count()
              << " ms; a rank silent for " << options.silence().count() << " ms is lost\n";
  }
  return std::make_unique<HeartbeatMonitor>(std::make_shared<TCPStore>(tcp->host(), connection),
                                            store_prefix(state), rank, world_size, options,
                                            &abort_live_backends);
}

/// Keeps rank 0 (which may host the TCP store) alive until every rank is done with the
/// store. Best effort: a rank that died never arrives, and then rank 0 gives up.
void exit_barrier(WorldState& state) {
  if (!state.world || state.world->size() == 1) return;
  // Per world: after shrink_group replaced the world, excluded ranks count for the old one.
  const std::string key = store_prefix(state) + "exit/" + state.world->name();
  try {
    state.store->add(key, 1);
    if (state.world->rank() != 0) return;
    auto limit = std::min(state.world->timeout(), std::chrono::milliseconds(30000));
    // After a loss (Note [Aborting on a lost peer]) the lost ranks never arrive: wait only
    // for the survivors that are destroying their groups too.
    if (live_backends_aborted()) limit = std::min(limit, std::chrono::milliseconds(2000));
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (state.store->add(key, 0) < state.world->size() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  } catch (const std::exception&) {
    // Peers may already be gone; destroying must not fail for that.
  }
}

}  // namespace

WorldState* world_state() {
  return state_slot().get();
}

std::string store_prefix(const WorldState& state) {
  return "tdist/" + std::to_string(state.generation) + "/";
}

void create_backends(ProcessGroup& pg, const std::map<std::string, std::string>& spec,
                     const StorePtr& group_store, std::chrono::milliseconds timeout,
                     const std::string& device_id,
                     std::map<std::string, CollectiveBackendPtr> made) {
  NewBackendsDeviceScope device_scope(device_id);
  for (const auto& [device, name] : spec) {
    auto it = made.find(name);
    if (it == made.end()) {
      auto factory = backend_factory(name);
      auto store = std::make_shared<PrefixStore>(name, group_store);
      CollectiveBackendPtr backend = factory(store, pg.rank(), pg.size(), timeout);
      if (!backend) {
        TDIST_THROW(DistBackendError, "the factory of backend '" + name + "' returned null");
      }
      it = made.emplace(name, std::move(backend)).first;
    }
    track_live_backend(it->second);  // Note [Aborting on a lost peer]
    CollectiveBackendPtr backend = it->second;
    // Note [Staging device tensors through the host].
    const c10::DeviceType type = c10::Device(device).type();
    if (!backend->takes_device_tensors(type)) backend = stage_through_host(backend, type);
    pg.set_backend(device, name, backend);
  }
}

ProcessGroupPtr resolve_group(const ProcessGroupPtr& group, const std::string& op) {
  WorldState* state = world_state();
  if (state == nullptr) {
    TDIST_THROW(InvalidArgument, op + " called before init_process_group: the default process "
                                      "group is not initialised; call "
                                      "tdist::init_process_group() first");
  }
  return group ? group : state->world;
}

}  // namespace detail

bool is_available() {
  return true;
}
bool is_initialized() {
  return detail::world_state() != nullptr;
}
bool is_gloo_available() {
  return detail::backend_registered(Backend::GLOO);
}
bool is_mpi_available() {
  return detail::backend_registered(Backend::MPI);
}
bool is_nccl_available() {
  return detail::backend_registered(Backend::NCCL);
}
bool is_xccl_available() {
  return detail::backend_registered(Backend::XCCL);
}
bool is_torchelastic_launched() {
  return std::getenv("TORCHELASTIC_RUN_ID") != nullptr;
}

bool is_backend_available(const std::string& backend) {
  // "gloo", or "cpu:gloo,cuda:nccl": every comma-separated entry's name after its colon.
  bool any = false;
  size_t begin = 0;
  while (begin <= backend.size()) {
    const size_t end = std::min(backend.find(',', begin), backend.size());
    const std::string entry = backend.substr(begin, end - begin);
    const size_t colon = entry.find(':');
    const std::string name = colon == std::string::npos ? entry : entry.substr(colon + 1);
    if (name.empty() || !detail::backend_registered(name)) return false;
    any = true;
    begin = end + 1;
  }
  return any;
}

int get_node_local_rank(std::optional<int> fallback_rank) {
  const auto local_rank =
      util::env_integer("LOCAL_RANK", 0, "a rank on this machine, 0 or more (as tdistrun sets)");
  if (local_rank) return static_cast<int>(*local_rank);
  if (fallback_rank) return *fallback_rank;
  TDIST_THROW(InvalidArgument,
              "get_node_local_rank: LOCAL_RANK is not in the environment (tdistrun and torchrun "
              "set it); pass fallback_rank to run without a launcher");
}

std::string get_default_backend_for_device(const std::string& device) {
  std::string type = device.substr(0, device.find(':'));
  std::transform(type.begin(), type.end(), type.begin(), ::tolower);
  auto defaults = Backend::default_device_backend_map();
  auto it = defaults.find(type);
  if (it == defaults.end()) {
    std::string known;
    for (const auto& [d, name] : defaults) known += (known.empty() ? "" : ", ") + d;
    TDIST_THROW(InvalidArgument, "get_default_backend_for_device: no backend serves device '" +
                                     device + "' (device types with a default: " + known + ")");
  }
  return it->second;
}

namespace {

// Note [OpenBLAS on CPUs it does not know] (src/util/openblas_core.h): too late to fix here.
void warn_if_generic_openblas() {
  static std::atomic<bool> warned{false};
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || warned.exchange(true)) return;
  const std::string core = detail::loaded_openblas_core();
  const char* fix = detail::openblas_coretype_fix(core);
  if (!fix) return;
  std::cerr << "tdist: warning: OpenBLAS does not recognise this CPU and runs its generic " + core +
                   " kernels (matmuls several times slower); start the process with "
                   "OPENBLAS_CORETYPE=" +
                   fix + " (tdistrun sets it for its workers)\n";
}

// Note [Launch environment precedence]: a process started by srun, mpirun or a Kubeflow
// PyTorchJob gets the torchrun variables its launcher implies, which env:// and every other
// reader of them (LOCAL_RANK, LOCAL_WORLD_SIZE) then use.
void adopt_launch_environment(bool say_it) {
  if (std::getenv("RANK") != nullptr) return;  // torchrun / tdistrun: used as they are
  const LaunchEnvironment launch = LaunchEnvironment::detect();
  launch.export_torchrun_variables();
  static std::atomic<bool> said{false};
  if (say_it && launch.found() && !said.exchange(true)) {
    std::cerr << "tdist: " + launch.describe() + "\n";
  }
}

}  // namespace

void init_process_group(const InitProcessGroupOptions& options) {
  using detail::WorldState;
  warn_if_generic_openblas();
  if (detail::world_state() != nullptr) {
    TDIST_THROW(InvalidArgument,
                "init_process_group called twice: the default process group "
                "is already initialised; call destroy_process_group() "
                "before initialising again");
  }
  auto spec = detail::parse_backend_spec(options.backend(), options.device_id());
  for (const auto& [device, name] : spec) detail::backend_factory(name);  // fail before rendezvous
  TDIST_CHECK_ARG(options.timeout().count() >= 0,
                  "init_process_group: timeout must not be negative (got " +
                      std::to_string(options.timeout().count()) + " ms)");
  auto timeout = options.timeout().count() > 0 ? options.timeout() : detail::default_timeout(spec);
  const detail::CommEnvironment comm_env = detail::reload_comm_environment();
  bool debug = comm_env.debug_detail;

  auto state = std::make_unique<WorldState>();
  int rank = options.rank();
  int world_size = options.world_size();
  TDIST_CHECK_ARG(rank >= -1, "init_process_group: rank=" + std::to_string(rank) +
                                  " is negative; ranks run from 0 to world_size-1");
  TDIST_CHECK_ARG(
      world_size >= -1 && world_size != 0,
      "init_process_group: world_size=" + std::to_string(world_size) + " must be positive");
  if (options.store()) {
    TDIST_CHECK_ARG(options.init_method().empty(),
                    "init_process_group: give either init_method or store, not both");
    TDIST_CHECK_ARG(rank >= 0 && world_size > 0,
                    "init_process_group: with an explicit store, rank and world_size must be "
                    "given (got rank=" +
                        std::to_string(rank) + ", world_size=" + std::to_string(world_size) + ")");
    TDIST_CHECK_ARG(rank < world_size, "init_process_group: rank " + std::to_string(rank) +
                                           " is not below world_size " +
                                           std::to_string(world_size));
    state->store = options.store();
  } else {
    // Started by a backend's own launcher (mpirun) with nothing else given: ask it.
    std::optional<LaunchInfo> launched;
    if (options.init_method().empty() && rank < 0 && world_size < 0 &&
        std::getenv("RANK") == nullptr) {
      std::vector<std::string> names;
      for (const auto& [device, name] : spec) names.push_back(name);
      launched = detail::launch_info_for(names, timeout);
    }
    if (launched) {
      state->store = launched->store;
      rank = launched->rank;
      world_size = launched->world_size;
    } else {
      if (rank < 0 && world_size < 0 &&
          (options.init_method().empty() || options.init_method() == "env://")) {
        adopt_launch_environment(comm_env.debug_info);
      }
      auto result = detail::rendezvous(options.init_method(), rank, world_size, timeout);
      state->store = result.store;
      rank = result.rank;
      world_size = result.world_size;
    }
    state->owns_store = true;
  }
  state->generation = ++detail::init_generation();
  state->backend_spec = spec;
  state->device_id = options.device_id();
  state->debug_detail = debug;
  const std::string prefix = detail::store_prefix(*state);
  detail::register_ranks(*state->store, prefix + "init/", rank, world_size, timeout);

  std::vector<int> ranks(world_size);
  for (int r = 0; r < world_size; ++r) ranks[r] = r;
  auto group_store = std::make_shared<PrefixStore>(prefix + "pg/0", state->store);
  auto world = std::make_shared<ProcessGroup>("0", group_store, rank, ranks, timeout);
  world->set_group_desc("default_pg");
  world->set_debug_detail(debug);
  detail::create_backends(*world, spec, group_store, timeout, state->device_id);
  // New groups' nccl binds the GPU the world's bound (its constructor made it current), not
  // one chosen again from a group rank: rank 2 of a world on 4 GPUs is rank 0 of {2, 3}.
  if (state->device_id.empty() && spec.count("cuda") && spec.at("cuda") == "nccl") {
    state->device_id = c10::impl::VirtualGuardImpl(c10::kCUDA).getDevice().str();
  }
  state->world = world;
  detail::forget_abort();  // the world a loss aborted was destroyed before this one
  state->heartbeat = detail::start_heartbeat(*state, comm_env, rank, world_size);
  detail::state_slot() = std::move(state);
}

void destroy_process_group(const ProcessGroupPtr& group) {
  auto* state = detail::world_state();
  if (state == nullptr) {
    TDIST_THROW(InvalidArgument,
                "destroy_process_group: the default process group is not "
                "initialised (call init_process_group first)");
  }
  if (group && group != state->world) {
    group->release_backends();
    auto& groups = state->groups;
    groups.erase(std::remove(groups.begin(), groups.end(), group), groups.end());
    return;
  }
  state->heartbeat.reset();
  detail::exit_barrier(*state);
  for (auto& g : state->groups) g->release_backends();
  state->world->release_backends();
  detail::state_slot().reset();
}

ProcessGroupPtr group_world() {
  return detail::resolve_group(nullptr, "group_world");
}

c10::Device get_default_device(const ProcessGroupPtr& group) {
  return detail::resolve_group(group, "get_default_device")->default_device();
}

at::Tensor to_collective_device(const at::Tensor& t, const ProcessGroupPtr& group) {
  auto pg = detail::resolve_group(group, "to_collective_device");
  const std::string type = c10::DeviceTypeName(t.device().type(), /*lower_case=*/true);
  return pg->backend_names().count(type) ? t : t.to(pg->default_device());
}

ProcessGroupPtr new_group(std::vector<int> ranks, const NewGroupOptions& options) {
  auto world = detail::resolve_group(nullptr, "new_group");
  auto& state = *detail::world_state();
  const int world_size = world->size();
  if (ranks.empty()) {
    for (int r = 0; r < world_size; ++r) ranks.push_back(r);
  }
  std::set<int> seen;
  for (int r : ranks) {
    TDIST_CHECK_ARG(r >= 0 && r < world_size, "new_group: rank " + std::to_string(r) +
                                                  " is outside the world [0, " +
                                                  std::to_string(world_size) + ")");
    TDIST_CHECK_ARG(seen.insert(r).second,
                    "new_group: rank " + std::to_string(r) + " is listed twice");
  }
  std::sort(ranks.begin(), ranks.end());
  TDIST_CHECK_ARG(options.timeout().count() >= 0, "new_group: timeout must not be negative");
  auto timeout = options.timeout().count() > 0 ? options.timeout() : world->timeout();
  auto spec = options.backend().empty()
                  ? state.backend_spec
                  : detail::parse_backend_spec(options.backend(), state.device_id);
  for (const auto& [device, name] : spec) detail::backend_factory(name);

  // Every rank counts every group, members or not, so names agree across the world.
  const std::string name = std::to_string(++state.group_counter);
  int my_rank = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == world->rank()) my_rank = static_cast<int>(i);
  }
  auto group_store =
      std::make_shared<PrefixStore>(detail::store_prefix(state) + "pg/" + name, state.store);
  auto pg = std::make_shared<ProcessGroup>(name, group_store, my_rank, ranks, timeout);
  pg->set_group_desc("undefined");
  pg->set_debug_detail(state.debug_detail);
  if (my_rank >= 0) detail::create_backends(*pg, spec, group_store, timeout, state.device_id);
  state.groups.push_back(pg);
  return pg;
}

int get_rank(const ProcessGroupPtr& group) {
  return detail::resolve_group(group, "get_rank")->rank();
}

int get_world_size(const ProcessGroupPtr& group) {
  auto pg = detail::resolve_group(group, "get_world_size");
  return pg->is_member() ? pg->size() : -1;
}

int get_group_rank(const ProcessGroupPtr& group, int global_rank) {
  return detail::resolve_group(group, "get_group_rank")->group_rank(global_rank);
}

int get_global_rank(const ProcessGroupPtr& group, int group_rank) {
  return detail::resolve_group(group, "get_global_rank")->global_rank(group_rank);
}

std::string get_backend(const ProcessGroupPtr& group) {
  auto pg = detail::resolve_group(group, "get_backend");
  TDIST_CHECK_ARG(pg->is_member(),
                  "get_backend: this process is not a member of group '" + pg->name() + "'");
  return detail::spec_text(pg->backend_names());
}

std::string get_backend_config(const ProcessGroupPtr& group) {
  auto pg = detail::resolve_group(group, "get_backend_config");
  TDIST_CHECK_ARG(pg->is_member(),
                  "get_backend_config: this process is not a member of group '" + pg->name() + "'");
  std::string out;
  for (const auto& [device, name] : pg->backend_names()) {
    out += (out.empty() ? "" : ",") + device + ":" + name;
  }
  return out;
}

}  // namespace tdist

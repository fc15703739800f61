#pragma once

// Backend names (torch.distributed.Backend) and the registry of backend factories through
// which gloo, mpi and third-party engines are created.

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tdist/comm/collective_backend.h"
#include "tdist/store/store.h"

namespace tdist {

/// Creates a backend for one group. The store is private to that group (prefixed).
using BackendFactory = std::function<CollectiveBackendPtr(
    const StorePtr& store, int rank, int world_size, std::chrono::milliseconds timeout)>;

/// What a backend's own launcher (e.g. mpirun) told this process: its rank, the world size,
/// and a store for the job. Lets init_process_group("mpi") run under mpirun without
/// MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE.
struct LaunchInfo {
  StorePtr store;
  int rank = -1;
  int world_size = -1;
};
/// Returns the launch info when this process was started by the backend's launcher, else
/// std::nullopt (init_process_group then falls back to env://).
using LaunchBootstrap = std::function<std::optional<LaunchInfo>(std::chrono::milliseconds)>;

/// An enum-like lower-case backend name. Backend("GLOO") == "gloo"; an unknown name throws
/// InvalidArgument listing the known ones. UNDEFINED exists only as an initial value.
class Backend {
 public:
  static const char* const UNDEFINED;
  static const char* const GLOO;
  static const char* const MPI;
  static const char* const NCCL;
  static const char* const UCC;
  static const char* const XCCL;

  Backend() : name_(UNDEFINED) {}
  /*implicit*/ Backend(const std::string& name);
  /*implicit*/ Backend(const char* name) : Backend(std::string(name)) {}

  const std::string& str() const { return name_; }
  operator const std::string&() const { return name_; }
  bool operator==(const Backend& other) const { return name_ == other.name_; }
  bool operator!=(const Backend& other) const { return name_ != other.name_; }

  /// Registers a third-party backend under `name` (stored lower-case), for `devices`
  /// (e.g. {"cpu"}). `extended_api`: the factory takes the full (store, rank, size, timeout)
  /// signature; kept for parity with torch.distributed, where it selects the newer factory
  /// signature. Registering an existing name throws.
  static void register_backend(const std::string& name, BackendFactory factory,
                               bool extended_api = false,
                               std::vector<std::string> devices = {"cpu"});

  /// Registers how backend `name` learns rank and world size from its own launcher.
  static void register_launch_bootstrap(const std::string& name, LaunchBootstrap bootstrap);

  /// Every registered name, built-in ones included.
  static std::vector<std::string> backend_list();
  /// Device types each backend supports.
  static std::map<std::string, std::vector<std::string>> backend_capability();
  /// The default backend per device type ("cpu" -> "gloo", "cuda" -> "nccl").
  static std::map<std::string, std::string> default_device_backend_map();

 private:
  std::string name_;
};

/// The device_id of the process group whose backends are being created (see
/// InitProcessGroupOptions::device_id), e.g. "cuda:1"; "" when none was given. Factories of
/// accelerator backends read it to bind their device.
std::string device_id_for_new_backends();

namespace detail {
/// Sets device_id_for_new_backends() on this thread while it lives.
class NewBackendsDeviceScope {
 public:
  explicit NewBackendsDeviceScope(std::string device_id);
  ~NewBackendsDeviceScope();
  NewBackendsDeviceScope(const NewBackendsDeviceScope&) = delete;
  NewBackendsDeviceScope& operator=(const NewBackendsDeviceScope&) = delete;

 private:
  std::string previous_;
};
/// Looks up a registered factory; throws InvalidArgument naming the available backends
/// (and why a built-in one is unavailable in this build).
BackendFactory backend_factory(const std::string& name);
/// The launch info of the first backend in `names` whose launcher started this process.
std::optional<LaunchInfo> launch_info_for(const std::vector<std::string>& names,
                                          std::chrono::milliseconds timeout);
/// True if the named backend is registered and usable in this build.
bool backend_registered(const std::string& name);
/// Names of the backends registered (usable) in this process.
std::vector<std::string> usable_backends();
/// Device types the named backend serves (empty if unknown).
std::vector<std::string> backend_devices(const std::string& name);
}  // namespace detail

}  // namespace tdist

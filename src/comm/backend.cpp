#include "tdist/comm/backend.h"

#include <algorithm>
#include <cctype>
#include <mutex>
#include <utility>

#include "tdist/detail/util/text.h"
#include "tdist/error.h"

namespace tdist {

const char* const Backend::UNDEFINED = "undefined";
const char* const Backend::GLOO = "gloo";
const char* const Backend::MPI = "mpi";
const char* const Backend::NCCL = "nccl";
const char* const Backend::UCC = "ucc";
const char* const Backend::XCCL = "xccl";

namespace {

struct Entry {
  BackendFactory factory;
  std::vector<std::string> devices;
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, Entry> entries;
  std::map<std::string, std::string> device_defaults{{"cpu", "gloo"}, {"cuda", "nccl"}};
  // Engines register themselves (src/gloo/registration.cpp, src/mpi/registration.cpp, ...):
  // this layer knows backends by name only.
  std::map<std::string, LaunchBootstrap> bootstraps;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

thread_local std::string t_device_id_for_new_backends;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

const std::vector<std::string>& builtin_names() {
  static const std::vector<std::string> names{"gloo", "mpi", "nccl", "ucc", "xccl"};
  return names;
}

/// Why a built-in backend that is not registered cannot be used here.
std::string unavailable_reason(const std::string& name) {
  if (name == "nccl") return "nccl is not available in this build (no CUDA)";
  if (name == "xccl") return "xccl is not available in this build (no Intel GPU support)";
  if (name == "ucc") return "ucc is not available in this build (no UCC library)";
  if (name == "mpi") {
    return "mpi is not available in this build (configure with TDIST_WITH_MPI=ON and OpenMPI "
           "installed)";
  }
  if (name == "gloo") return "gloo is not available in this build";
  return name + " is not registered";
}

}  // namespace

Backend::Backend(const std::string& name) {
  std::string value = lower(name);
  if (value == UNDEFINED) {
    name_ = UNDEFINED;
    return;
  }
  auto& known = builtin_names();
  bool ok = std::find(known.begin(), known.end(), value) != known.end();
  if (!ok) {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    ok = reg.entries.count(value) > 0;
  }
  if (!ok) {
    TDIST_THROW(InvalidArgument, "unknown backend '" + name +
                                     "'; known backends: " + util::join(backend_list()) +
                                     " (register others with Backend::register_backend)");
  }
  name_ = value;
}

void Backend::register_backend(const std::string& name, BackendFactory factory,
                               bool /*extended_api: one factory signature here*/,
                               std::vector<std::string> devices) {
  std::string key = lower(name);
  TDIST_CHECK_ARG(!key.empty() && key != UNDEFINED && key.find_first_of(":,") == std::string::npos,
                  "Backend::register_backend: invalid backend name '" + name + "'");
  TDIST_CHECK_ARG(factory != nullptr,
                  "Backend::register_backend: the factory for '" + name + "' is empty");
  TDIST_CHECK_ARG(!devices.empty(), "Backend::register_backend: backend '" + name +
                                        "' must support at least one device type");
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  if (reg.entries.count(key)) {
    TDIST_THROW(InvalidArgument, "Backend::register_backend: backend '" + key +
                                     "' is already registered; pick another name");
  }
  for (auto& device : devices) {
    device = lower(device);
    // A new backend becomes the default only for device types nobody serves yet.
    if (!reg.device_defaults.count(device)) reg.device_defaults[device] = key;
  }
  reg.entries[key] = Entry{std::move(factory), std::move(devices)};
}

void Backend::register_launch_bootstrap(const std::string& name, LaunchBootstrap bootstrap) {
  TDIST_CHECK_ARG(bootstrap != nullptr,
                  "Backend::register_launch_bootstrap: the bootstrap for '" + name + "' is empty");
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  reg.bootstraps[lower(name)] = std::move(bootstrap);
}

std::vector<std::string> Backend::backend_list() {
  std::vector<std::string> out = builtin_names();
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  for (const auto& [name, entry] : reg.entries) {
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

std::map<std::string, std::vector<std::string>> Backend::backend_capability() {
  std::map<std::string, std::vector<std::string>> out{{"nccl", {"cuda"}}, {"xccl", {"xpu"}}};
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  for (const auto& [name, entry] : reg.entries) out[name] = entry.devices;
  if (!out.count("gloo")) out["gloo"] = {"cpu"};
  if (!out.count("mpi")) out["mpi"] = {"cpu"};
  return out;
}

std::map<std::string, std::string> Backend::default_device_backend_map() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return reg.device_defaults;
}

namespace detail {

BackendFactory backend_factory(const std::string& name) {
  std::string key = lower(name);
  auto& reg = registry();
  {
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto it = reg.entries.find(key);
    if (it != reg.entries.end()) return it->second.factory;
  }
  auto& known = builtin_names();
  if (std::find(known.begin(), known.end(), key) != known.end()) {
    TDIST_THROW(InvalidArgument, "backend '" + key +
                                     "' cannot be used: " + unavailable_reason(key) +
                                     "; usable backends here: " + util::join(usable_backends()));
  }
  TDIST_THROW(InvalidArgument, "unknown backend '" + name +
                                   "'; usable backends here: " + util::join(usable_backends()) +
                                   " (register others with Backend::register_backend)");
}

std::optional<LaunchInfo> launch_info_for(const std::vector<std::string>& names,
                                          std::chrono::milliseconds timeout) {
  for (const auto& name : names) {
    LaunchBootstrap bootstrap;
    {
      auto& reg = registry();
      std::lock_guard<std::mutex> lock(reg.mutex);
      auto it = reg.bootstraps.find(lower(name));
      if (it == reg.bootstraps.end()) continue;
      bootstrap = it->second;
    }
    if (auto info = bootstrap(timeout)) return info;
  }
  return std::nullopt;
}

bool backend_registered(const std::string& name) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return reg.entries.count(lower(name)) > 0;
}

std::vector<std::string> usable_backends() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::vector<std::string> out;
  for (const auto& [name, entry] : reg.entries) out.push_back(name);
  return out;
}

std::vector<std::string> backend_devices(const std::string& name) {
  auto caps = Backend::backend_capability();
  auto it = caps.find(lower(name));
  return it == caps.end() ? std::vector<std::string>{} : it->second;
}

}  // namespace detail

std::string device_id_for_new_backends() {
  return t_device_id_for_new_backends;
}

namespace detail {
NewBackendsDeviceScope::NewBackendsDeviceScope(std::string device_id)
    : previous_(std::exchange(t_device_id_for_new_backends, std::move(device_id))) {}
NewBackendsDeviceScope::~NewBackendsDeviceScope() {
  t_device_id_for_new_backends = std::move(previous_);
}
}  // namespace detail

}  // namespace tdist

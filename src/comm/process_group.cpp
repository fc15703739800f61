#include "tdist/comm/process_group.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include "tdist/error.h"

namespace tdist {

ProcessGroup::ProcessGroup(std::string name, StorePtr store, int rank,
                           std::vector<int> global_ranks, std::chrono::milliseconds timeout)
    : name_(std::move(name)),
      store_(std::move(store)),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
      timeout_(timeout) {
  TDIST_CHECK_ARG(rank_ >= -1 && rank_ < static_cast<int>(global_ranks_.size()),
                  "ProcessGroup '" + name_ + "': rank " + std::to_string(rank_) +
                      " is outside the group of size " + std::to_string(global_ranks_.size()));
}

int ProcessGroup::group_rank(int global_rank) const {
  for (size_t i = 0; i < global_ranks_.size(); ++i) {
    if (global_ranks_[i] == global_rank) return static_cast<int>(i);
  }
  std::string members;
  for (int r : global_ranks_) members += (members.empty() ? "" : ",") + std::to_string(r);
  TDIST_THROW(InvalidArgument, "global rank " + std::to_string(global_rank) +
                                   " is not a member of process group '" + name_ + "' (members: [" +
                                   members + "])");
}

int ProcessGroup::global_rank(int group_rank) const {
  TDIST_CHECK_ARG(group_rank >= 0 && group_rank < size(),
                  "group rank " + std::to_string(group_rank) +
                      " is out of range for process group '" + name_ + "' of size " +
                      std::to_string(size()));
  return global_ranks_[group_rank];
}

std::map<std::string, std::string> ProcessGroup::backend_names() const {
  std::map<std::string, std::string> out;
  for (const auto& [device, entry] : backends_) out[device] = entry.first;
  return out;
}

void ProcessGroup::set_backend(const std::string& device_type, const std::string& backend_name,
                               CollectiveBackendPtr backend) {
  TDIST_CHECK_ARG(backend != nullptr,
                  "ProcessGroup::set_backend: null backend for device '" + device_type + "'");
  backends_[device_type] = {backend_name, std::move(backend)};
}

void ProcessGroup::release_backends() {
  backends_.clear();
  destroyed_ = true;
}

CollectiveBackend& ProcessGroup::backend(const std::string& device_type) const {
  if (destroyed_) {
    TDIST_THROW(InvalidArgument, "process group '" + name_ +
                                     "' was destroyed by destroy_process_group; create a new "
                                     "group (or re-initialise) before running collectives");
  }
  if (!is_member()) {
    TDIST_THROW(InvalidArgument, "this process is not a member of process group '" + name_ +
                                     "'; only its members may run collectives on it");
  }
  auto it = backends_.find(device_type);
  if (it == backends_.end()) {
    std::string configured;
    for (const auto& [device, entry] : backends_) {
      configured += (configured.empty() ? "" : ",") + device + ":" + entry.first;
    }
    TDIST_THROW(InvalidArgument,
                "process group '" + name_ + "' has no backend for device type '" + device_type +
                    "' (configured: " + (configured.empty() ? "none" : configured) +
                    "); move the tensor to a served device or initialise "
                    "with e.g. backend \"cpu:gloo,cuda:nccl\"");
  }
  return *it->second.second;
}

CollectiveBackend& ProcessGroup::backend_for(const at::Tensor& tensor) const {
  TDIST_CHECK_ARG(tensor.defined(), "process group '" + name_ + "': the tensor is undefined");
  return backend(c10::DeviceTypeName(tensor.device().type(), /*lower_case=*/true));
}

CollectiveBackend& ProcessGroup::default_backend() const {
  if (backends_.count("cpu") || backends_.empty()) return backend("cpu");
  return *backends_.begin()->second.second;
}

c10::Device ProcessGroup::default_device() const {
  if (backends_.count("cpu") || backends_.empty()) return c10::Device(c10::kCPU);
  const c10::DeviceType type = c10::Device(backends_.begin()->first).type();
  return c10::impl::VirtualGuardImpl(type).getDevice();
}

}  // namespace tdist

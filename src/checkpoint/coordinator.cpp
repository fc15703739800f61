#include "tdist/checkpoint/coordinator.h"

#include "tdist/comm/distributed.h"
#include "tdist/comm/object_collectives.h"
#include "tdist/error.h"

namespace tdist::checkpoint {

StoreCoordinator::StoreCoordinator(StorePtr store, int rank, int world_size, std::string prefix,
                                   std::chrono::milliseconds timeout)
    : store_(std::move(store)) {
  TDIST_CHECK_ARG(store_ != nullptr, "StoreCoordinator: store is null");
  TDIST_CHECK_ARG(rank >= 0 && rank < world_size, "StoreCoordinator: rank " + std::to_string(rank) +
                                                      " is outside world size " +
                                                      std::to_string(world_size));
  // Every rank creates its coordinators in the same order, so the n-th one of each rank
  // shares the same key space and never reads a stale message of an earlier one.
  const int64_t instance = store_->add(prefix + "/instances/" + std::to_string(rank), 1);
  gather_ = StoreAllGatherOptions()
                .prefix(prefix + "/" + std::to_string(instance))
                .rank(rank)
                .world_size(world_size)
                .timeout(timeout)
                .purpose("checkpoint");
}

std::vector<std::string> StoreCoordinator::all_gather(const std::string& message) {
  const std::vector<uint8_t> mine(message.begin(), message.end());
  std::vector<std::string> out;
  for (const auto& value : store_all_gather(*store_, round_++, mine, gather_)) {
    out.emplace_back(value.begin(), value.end());
  }
  return out;
}

ProcessGroupCoordinator::ProcessGroupCoordinator(ProcessGroupPtr group)
    : group_(group ? std::move(group) : group_world()) {
  TDIST_CHECK_ARG(group_->is_member(),
                  "ProcessGroupCoordinator: this process is not a member of process group '" +
                      group_->name() + "'; coordinate a checkpoint through a group it belongs to");
}

int ProcessGroupCoordinator::rank() const {
  return group_->rank();
}
int ProcessGroupCoordinator::world_size() const {
  return group_->size();
}

std::vector<std::string> ProcessGroupCoordinator::all_gather(const std::string& message) {
  // all_gather_object exchanges on the group's default device: a group of nccl alone has no
  // CPU backend.
  std::vector<Object> gathered;
  tdist::all_gather_object(gathered, Object(message), group_);
  std::vector<std::string> out;
  for (const auto& o : gathered) out.push_back(o.as_string());
  return out;
}

CoordinatorPtr default_coordinator() {
  if (tdist::is_initialized() && tdist::get_world_size() > 1) {
    return std::make_shared<ProcessGroupCoordinator>();
  }
  return std::make_shared<LocalCoordinator>();
}

CoordinatorPtr default_background_coordinator() {
  if (tdist::is_initialized() && tdist::get_world_size() > 1) {
    const ProcessGroupPtr world = group_world();
    return std::make_shared<StoreCoordinator>(world->store(), world->rank(), world->size(),
                                              "background_checkpoint");
  }
  return std::make_shared<LocalCoordinator>();
}

}  // namespace tdist::checkpoint

#include "tdist/checkpoint/coordinator.h"

#include <cstring>

#include <ATen/ATen.h>

#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::checkpoint {

StoreCoordinator::StoreCoordinator(StorePtr store, int rank, int world_size, std::string prefix,
                                   std::chrono::milliseconds timeout)
    : store_(std::move(store)), rank_(rank), world_size_(world_size), timeout_(timeout) {
  TDIST_CHECK_ARG(store_ != nullptr, "StoreCoordinator: store is null");
  TDIST_CHECK_ARG(rank >= 0 && rank < world_size, "StoreCoordinator: rank " + std::to_string(rank) +
                                                      " is outside world size " +
                                                      std::to_string(world_size));
  // Every rank creates its coordinators in the same order, so the n-th one of each rank
  // shares the same key space and never reads a stale message of an earlier one.
  const int64_t instance = store_->add(prefix + "/instances/" + std::to_string(rank), 1);
  prefix_ = prefix + "/" + std::to_string(instance);
}

std::vector<std::string> StoreCoordinator::all_gather(const std::string& message) {
  const uint64_t round = round_++;
  auto key = [&](uint64_t r, int rank) {
    return prefix_ + "/" + std::to_string(r) + "/" + std::to_string(rank);
  };
  store_->set(key(round, rank_), message);
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) keys.push_back(key(round, r));
  try {
    store_->wait(keys, timeout_);
  } catch (const TimeoutError&) {
    std::string missing;
    for (int r = 0; r < world_size_; ++r) {
      if (!store_->check({keys[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    TDIST_THROW(TimeoutError, "checkpoint: rank " + std::to_string(rank_) + " waited " +
                                  std::to_string(timeout_.count()) + " ms for rank(s) " + missing +
                                  " to report (round " + std::to_string(round) +
                                  "); they crashed or hang");
  }
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(store_->get_string(k));
  // Everyone has read round-2: they all wrote round-1, which they do after reading round-2.
  if (round >= 2) store_->delete_key(key(round - 2, rank_));
  return out;
}

ProcessGroupCoordinator::ProcessGroupCoordinator(ProcessGroupPtr group)
    : group_(group ? std::move(group) : group_world()) {}

int ProcessGroupCoordinator::rank() const {
  return group_->rank();
}
int ProcessGroupCoordinator::world_size() const {
  return group_->size();
}

std::vector<std::string> ProcessGroupCoordinator::all_gather(const std::string& message) {
  const int n = group_->size();
  // On the group's device: a group of nccl alone has no CPU backend.
  const c10::Device device = tdist::get_default_device(group_);
  at::Tensor length = at::full({1}, static_cast<int64_t>(message.size()), at::kLong).to(device);
  std::vector<at::Tensor> lengths;
  for (int r = 0; r < n; ++r)
    lengths.push_back(at::empty({1}, at::dtype(at::kLong).device(device)));
  tdist::all_gather(lengths, length, group_);
  for (auto& l : lengths) l = l.cpu();
  int64_t longest = 1;
  for (const auto& l : lengths) longest = std::max(longest, l.item<int64_t>());
  at::Tensor mine = at::zeros({longest}, at::kByte);
  std::memcpy(mine.data_ptr<uint8_t>(), message.data(), message.size());
  mine = mine.to(device);
  std::vector<at::Tensor> all;
  for (int r = 0; r < n; ++r)
    all.push_back(at::empty({longest}, at::dtype(at::kByte).device(device)));
  tdist::all_gather(all, mine, group_);
  for (auto& a : all) a = a.cpu();
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    const auto* p = reinterpret_cast<const char*>(all[r].data_ptr<uint8_t>());
    out.emplace_back(p, p + lengths[r].item<int64_t>());
  }
  return out;
}

CoordinatorPtr default_coordinator() {
  if (tdist::is_initialized() && tdist::get_world_size() > 1) {
    return std::make_shared<ProcessGroupCoordinator>();
  }
  return std::make_shared<LocalCoordinator>();
}

}  // namespace tdist::checkpoint

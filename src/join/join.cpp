#include "tdist/join/join.h"

#include <iostream>

#include <ATen/ATen.h>

#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::join {

Join::Join(std::vector<Joinable*> joinables, bool enable, bool throw_on_early_termination,
           const JoinKwargs& kwargs)
    : joinables_(std::move(joinables)),
      enable_(enable),
      throw_on_early_termination_(throw_on_early_termination) {
  TDIST_CHECK_ARG(!joinables_.empty(), "Join: give at least one Joinable");
  for (auto* j : joinables_) TDIST_CHECK_ARG(j != nullptr, "Join: a Joinable is null");
  bool first = true;
  for (auto* j : joinables_) {
    j->join_config_ = JoinConfig{enable_, throw_on_early_termination_, first};
    first = false;
  }
  // All hooks share one group (checked) and the first Joinable's device.
  group_ = joinables_[0]->join_process_group();
  device_ = joinables_[0]->join_device();
  for (auto* j : joinables_) {
    auto pg = j->join_process_group();
    const bool same =
        (pg == group_) || (pg && group_ && pg->global_ranks() == group_->global_ranks() &&
                           pg->name() == group_->name());
    if (!same) {
      TDIST_THROW(InvalidArgument,
                  "Join: the Joinables use different process groups; the join protocol runs on "
                  "one group, so give every Joinable the same process_group");
    }
  }
  rank_ = get_rank(group_);
  for (auto* j : joinables_) hooks_.push_back(j->join_hook(kwargs));
}

Join::~Join() {
  for (auto* j : joinables_) j->join_config_ = JoinConfig{};
}

int Join::num_nonjoined_ranks() {
  // Shadows the all-reduce of ones that every non-joined rank issues in notify_join_context.
  at::Tensor count = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device_));
  all_reduce(count, ReduceOp::SUM, group_);
  return count.item<int>();
}

void Join::notify_ranks_to_terminate() {
  // Matches the all-reduce of zeros in notify_join_context of the non-joined ranks.
  at::Tensor ones = at::ones({1}, at::TensorOptions().dtype(at::kInt).device(device_));
  all_reduce(ones, ReduceOp::SUM, group_);
  TDIST_THROW(Error, "rank " + std::to_string(rank_) +
                         ": Join: this rank exhausted all its inputs while other ranks have "
                         "more (throw_on_early_termination=true); give every rank the same "
                         "number of inputs or drop throw_on_early_termination");
}

void Join::exit() {
  if (exited_) return;
  exited_ = true;
  if (!enable_) return;
  bool is_last_joiner = true;
  constexpr int kWarnThreshold = 1000;
  for (int i = 0;; ++i) {
    if (i == kWarnThreshold) {
      std::cerr << "tdist Join (rank " << rank_ << "): detected uneven input for more than "
                << kWarnThreshold << " iterations; this rank's inputs are much shorter than "
                << "another's\n";
    }
    if (num_nonjoined_ranks() == 0) break;
    if (throw_on_early_termination_) notify_ranks_to_terminate();
    for (auto& hook : hooks_) hook->main_hook();
    is_last_joiner = false;
  }
  for (auto& hook : hooks_) hook->post_hook(is_last_joiner);
}

WorkPtr Join::notify_join_context(Joinable& joinable) {
  const JoinConfig& config = joinable.join_config_;
  if (!config.is_first_joinable || !config.enable) return nullptr;
  const auto device = joinable.join_device();
  const auto group = joinable.join_process_group();
  // Tell the joined ranks (in num_nonjoined_ranks) that this rank is still training.
  at::Tensor ones = at::ones({1}, at::TensorOptions().dtype(at::kInt).device(device));
  WorkPtr work = all_reduce(ones, ReduceOp::SUM, group, /*async_op=*/true);
  if (config.throw_on_early_termination) {
    at::Tensor zeros = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device));
    all_reduce(zeros, ReduceOp::SUM, group);
    if (zeros.item<int>() != 0) {
      work->wait();
      TDIST_THROW(Error, "rank " + std::to_string(get_rank(group)) +
                             ": Join: detected at least one rank that exhausted its inputs; "
                             "raising on every rank (throw_on_early_termination=true)");
    }
  }
  return work;
}

}  // namespace tdist::join

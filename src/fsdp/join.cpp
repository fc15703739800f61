#include "tdist/fsdp/join.h"

#include "fsdp/fsdp_state.h"
#include "fsdp/registry.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::fsdp {

namespace {

class FSDPJoinHook : public join::JoinHook {
 public:
  explicit FSDPJoinHook(FSDPJoinable& joinable) : joinable_(joinable) {}
  void main_hook() override { joinable_.shadow_step(); }

 private:
  FSDPJoinable& joinable_;
};

}  // namespace

FSDPJoinable::FSDPJoinable(FSDPModule root, std::function<void()> step)
    : root_(std::move(root)), step_(std::move(step)) {
  TDIST_CHECK_ARG(static_cast<bool>(root_), "FSDPJoinable: empty FSDPModule handle");
  TDIST_CHECK_ARG(detail::state_of(root_).parent() == nullptr,
                  "FSDPJoinable: pass the root fully_shard'ed module (the outermost one), not '" +
                      root_.label() + "'");
  detail::state_of(root_).set_joinable(this);
}

FSDPJoinable::~FSDPJoinable() {
  detail::state_of(root_).set_joinable(nullptr);
}

std::unique_ptr<join::JoinHook> FSDPJoinable::join_hook(const join::JoinKwargs& /*kwargs*/) {
  return std::make_unique<FSDPJoinHook>(*this);
}

ProcessGroupPtr FSDPJoinable::join_process_group() const {
  return group_world();
}

void FSDPJoinable::shadow_step() {
  detail::FSDPState& root = detail::state_of(root_);
  const detail::CommContext& comm = root.comm();
  if (comm.last_step().empty()) {
    TDIST_THROW(Error, "rank " + std::to_string(get_rank()) +
                           ": FSDP Join: this rank ran out of inputs before it completed one "
                           "training step, so it cannot know which collectives to shadow; "
                           "give every rank at least one batch");
  }
  auto module = root.module().lock();
  if (!module) TDIST_THROW(Error, "FSDP Join: the root module no longer exists");
  std::vector<detail::FSDPState*> states = detail::states_under(*module);
  // The optimizer steps what the reduce-scatters install (as zero_grad(set_to_none)).
  for (detail::FSDPState* s : states) {
    if (auto* g = s->group()) {
      for (const auto& p : g->params()) p->param().mutable_grad() = at::Tensor();
    }
  }
  for (const detail::CommEvent& event : comm.last_step()) {
    switch (event.kind) {
      case detail::CommEvent::Kind::kAllGather:
        event.group->replay_all_gather(/*from_post_forward_slab=*/false);
        break;
      case detail::CommEvent::Kind::kAllGatherPostForward:
        event.group->replay_all_gather(/*from_post_forward_slab=*/true);
        break;
      case detail::CommEvent::Kind::kReduceScatter:
        event.group->replay_reduce_scatter();
        break;
    }
  }
  for (detail::FSDPState* s : states) {
    if (auto* g = s->group()) g->reshard();
  }
  if (step_) step_();
}

}  // namespace tdist::fsdp

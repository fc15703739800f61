#pragma once

// Join for FSDP (uneven inputs; no framework offers it: pytorch#64683).
//
//   tdist::fsdp::FSDPJoinable joinable(tdist::fsdp::fsdp_module(*model),
//                                      [&] { optimizer.step(); });
//   tdist::join::Join({&joinable}).run([&] {
//     for (auto& batch : my_batches) {            // some ranks have fewer batches
//       optimizer.zero_grad();
//       tdist::fsdp::forward(model, batch).backward();
//       optimizer.step();
//     }
//   });
//
// A rank that ran out of data still owns 1/N of every parameter: the others need its
// shards to all-gather, and its shards must be stepped with the gradients the others
// produce. So each iteration it shadows, in the same order, the collectives FSDP issued in
// the last training step: its all-gathers with its real shards, its reduce-scatters with
// zero gradients (the reduced shard gradient is installed as usual: the mean over the
// initial world size, the joined ranks contributing zeros). Then it runs `step` (what the
// training ranks do after backward: optimizer step, and clip_grad_norm_ if they clip, since
// that is a collective too).

#include <functional>
#include <memory>

#include "tdist/fsdp/fully_shard.h"
#include "tdist/join/join.h"

namespace tdist::fsdp {

class FSDPJoinable : public join::Joinable {
 public:
  /// `root`: the outermost fully_shard'ed module (the one the training loop calls).
  FSDPJoinable(FSDPModule root, std::function<void()> step);
  ~FSDPJoinable() override;
  FSDPJoinable(const FSDPJoinable&) = delete;
  FSDPJoinable& operator=(const FSDPJoinable&) = delete;

  std::unique_ptr<join::JoinHook> join_hook(const join::JoinKwargs& kwargs) override;
  c10::Device join_device() const override { return c10::kCPU; }
  ProcessGroupPtr join_process_group() const override;

  /// Replays the last training step's collectives with zero gradients, then runs `step`.
  void shadow_step();

 private:
  FSDPModule root_;
  std::function<void()> step_;
};

}  // namespace tdist::fsdp

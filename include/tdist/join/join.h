#pragma once

// The generic join context manager for uneven inputs (torch.distributed.algorithms.Join,
// SPEC §3). Ranks that run out of inputs "join": they loop in Join::exit(), shadowing the
// collectives of the ranks still training through each Joinable's JoinHook, so nobody hangs.
//
//   tdist::join::Join join({&ddp, &zero});
//   join.run([&] { for (auto& batch : my_batches) { ... } });
//
// Python's `with Join(...)` becomes run(body) (or body followed by exit()): C++ destructors
// must not throw, and the exit protocol can raise (throw_on_early_termination).

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include "tdist/comm/process_group.h"
#include "tdist/comm/work.h"

namespace tdist::join {

/// Keyword arguments given to every Joinable's join_hook (e.g. DDP's
/// "divide_by_initial_world_size").
using JoinKwargs = std::map<std::string, c10::IValue>;

/// Two entry points a Joinable gives the join context manager.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  /// Called repeatedly while some rank has not joined: shadows the collectives of one
  /// training iteration (forward, backward and optimizer step).
  virtual void main_hook() {}
  /// Called once every rank has joined. is_last_joiner: this rank was among the last.
  virtual void post_hook(bool /*is_last_joiner*/) {}
};

/// Per-Joinable configuration set by the Join that holds it.
struct JoinConfig {
  bool enable = false;
  bool throw_on_early_termination = false;
  bool is_first_joinable = false;
};

/// Base class of anything that takes part in a Join (DDP, ZeroRedundancyOptimizer, yours).
/// A Joinable must call Join::notify_join_context(*this) before its own collectives in
/// every iteration.
class Joinable {
 public:
  virtual ~Joinable() = default;
  virtual std::unique_ptr<JoinHook> join_hook(const JoinKwargs& kwargs) = 0;
  /// Device of the tensors the join protocol all-reduces.
  virtual c10::Device join_device() const = 0;
  /// Group of the join protocol's collectives; every Joinable of one Join must agree.
  virtual ProcessGroupPtr join_process_group() const = 0;

  const JoinConfig& join_config() const { return join_config_; }

 private:
  friend class Join;
  JoinConfig join_config_;
};

struct JoinOptions {
  /// False turns the manager into a no-op (only when inputs are known to be even).
  bool enable = true;
  /// Raise on every rank as soon as one rank runs out of inputs.
  bool throw_on_early_termination = false;
  JoinKwargs kwargs;
};

class Join {
 public:
  /// Joinables are not owned; they must outlive the Join. Their hooks run in this order.
  explicit Join(std::vector<Joinable*> joinables, bool enable = true,
                bool throw_on_early_termination = false, const JoinKwargs& kwargs = {});
  Join(std::vector<Joinable*> joinables, const JoinOptions& options)
      : Join(std::move(joinables), options.enable, options.throw_on_early_termination,
             options.kwargs) {}
  /// Resets the Joinables' configuration (outside a Join, notify_join_context is a no-op).
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  /// Runs `body` (the training loop over this rank's inputs), then exit(). If body throws,
  /// the error propagates at once, without the join protocol (as Python's __exit__).
  template <typename Body>
  void run(Body&& body) {
    body();
    exit();
  }

  /// The join protocol: shadow the other ranks' iterations until every rank has joined,
  /// then run the post hooks. With throw_on_early_termination it raises instead.
  void exit();

  /// Tells the Join that the caller has not joined yet. Only the first Joinable's call
  /// issues a collective (an async all-reduce, whose Work it returns; null otherwise). With
  /// throw_on_early_termination it also checks whether a rank has joined and raises.
  static WorkPtr notify_join_context(Joinable& joinable);

 private:
  int num_nonjoined_ranks();
  [[noreturn]] void notify_ranks_to_terminate();

  std::vector<Joinable*> joinables_;
  std::vector<std::unique_ptr<JoinHook>> hooks_;
  bool enable_;
  bool throw_on_early_termination_;
  ProcessGroupPtr group_;
  c10::Device device_{c10::kCPU};
  int rank_ = 0;
  bool exited_ = false;
};

}  // namespace tdist::join

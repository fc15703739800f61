#pragma once

// How the launchers of a job agree on who is who, round by round. Round r is attempt r
// (TORCHELASTIC_RESTART_COUNT = r): every node joins it, gets its group rank and the ranks
// of its workers, and watches it; a failure on any node ends the round on every node.
//
// Note [Rendezvous keys]: all keys live under "tdistrun/<run id>/":
//   r<R>/claim/<g>   static mode: the launcher owning node rank g (duplicates are errors)
//   r<R>/next        dynamic mode: join counter; clients take group ranks 1, 2, ...
//   r<R>/node/<g>    "<nproc> <hostname>" of group rank g
//   r<R>/closed      number of nodes in the round, set by group rank 0 when complete
//   r<R>/master      "<addr> <port>": the workers' MASTER_ADDR / MASTER_PORT
//   r<R>/failure     the first failure summary of the round (compare_set: first wins)
//   r<R>/done        counter of nodes whose workers all succeeded
//   secret           the workers' store secret (when the launcher made one)
//   abort            a launcher was interrupted: every node stops without restarting
//   exit             counter of launchers that finished (node 0 waits before closing)

#include <chrono>
#include <functional>
#include <string>

#include "tdist/error.h"
#include "tdist/launch/launch_config.h"
#include "tdist/store/store.h"

namespace tdist::launch {

/// A launcher was interrupted (SIGINT/SIGTERM) while waiting for the others.
class Interrupted : public Error {
 public:
  using Error::Error;
};

struct RendezvousInfo {
  int round = 0;
  int group_rank = 0;
  int group_world_size = 1;
  int local_world_size = 1;
  int rank_offset = 0;  // RANK of this node's LOCAL_RANK 0
  int world_size = 1;
  std::string master_addr;
  int master_port = 0;
  /// The workers' store secret shared by every node; empty: none.
  std::string store_secret;
};

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  /// Joins round `round`; blocks until the round is complete (or join_timeout: TimeoutError,
  /// or `interrupted()` turned true: Interrupted).
  virtual RendezvousInfo join(int round) = 0;
  /// Records this node's failure in `round`; the first report of a round wins.
  virtual void report_failure(int round, const std::string& summary) = 0;
  /// Never blocks: true once any node reported a failure in `round`, or aborted.
  virtual bool failure_reported(int round) = 0;
  /// The first failure reported in `round` ("" if none).
  virtual std::string failure(int round) = 0;
  virtual void report_success(int round) = 0;
  /// Never blocks: true once every node of `round` reported success.
  virtual bool all_succeeded(int round) = 0;
  /// Tells every node to stop without restarting.
  virtual void abort(const std::string& reason) = 0;
  /// Never blocks: the abort reason, "" if nobody aborted.
  virtual std::string aborted() = 0;
  /// At exit; the node hosting the store waits (bounded) until the others are done with it.
  virtual void shutdown(bool quick) = 0;

  /// Polled while waiting; returning true makes join() throw Interrupted.
  void set_interrupt_check(std::function<bool()> check) { interrupted_ = std::move(check); }

 protected:
  bool interrupted() const { return interrupted_ && interrupted_(); }

 private:
  std::function<bool()> interrupted_;
};

/// One node, no store.
class LocalRendezvous : public Rendezvous {
 public:
  explicit LocalRendezvous(const LaunchConfig& config);
  RendezvousInfo join(int round) override;
  void report_failure(int round, const std::string& summary) override;
  bool failure_reported(int round) override;
  std::string failure(int round) override;
  void report_success(int) override {}
  bool all_succeeded(int) override { return true; }
  void abort(const std::string&) override {}
  std::string aborted() override { return ""; }
  void shutdown(bool) override {}

 private:
  LaunchConfig config_;
  std::string secret_;
  int failed_round_ = -1;
  std::string failure_;
};

/// Nodes meet in a store (a TCPStore at the rendezvous endpoint in tdistrun; any Store in
/// tests). `is_host`: this launcher hosts the store and is group rank 0.
class StoreRendezvous : public Rendezvous {
 public:
  StoreRendezvous(StorePtr store, const LaunchConfig& config, bool is_host);
  RendezvousInfo join(int round) override;
  void report_failure(int round, const std::string& summary) override;
  bool failure_reported(int round) override;
  std::string failure(int round) override;
  void report_success(int round) override;
  bool all_succeeded(int round) override;
  void abort(const std::string& reason) override;
  std::string aborted() override;
  void shutdown(bool quick) override;

 private:
  std::string key(const std::string& name) const { return prefix_ + name; }
  std::string round_key(int round, const std::string& name) const;
  int take_group_rank(int round);
  int close_round(int round);  // group rank 0 only: decides membership, publishes it
  void wait_for(const std::vector<std::string>& keys, const std::string& what);

  StorePtr store_;
  LaunchConfig config_;
  bool is_host_;
  std::string prefix_;
  int nodes_in_round_ = 0;
};

/// False when the launcher must not make a workers' store secret
/// (disabled, or the environment already carries TDIST_STORE_SECRET / _FILE).
bool should_make_store_secret(const LaunchConfig& config);

}  // namespace tdist::launch

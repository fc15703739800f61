#pragma once

// How the launchers of a job agree on who is who, round by round. Every node joins round r,
// gets its group rank and the ranks of its workers, and watches it; a failure on any node
// ends the round on every node, and so does a membership change (Note [Late joiners]).
// Rounds count both; TORCHELASTIC_RESTART_COUNT counts only the failures.
//
// Note [Rendezvous keys]: all keys live under "tdistrun/<run id>/":
//   r<R>/claim/<g>   static mode: the launcher owning node rank g (duplicates are errors)
//   r<R>/next        dynamic mode: join counter; clients take group ranks 1, 2, ...
//   r<R>/node/<g>    "<nproc> <hostname>" of group rank g
//   round            the latest round group rank 0 opened (where a new node starts)
//   r<R>/closed      number of nodes in the round, set by group rank 0 when complete
//   r<R>/restarts    failure restarts before round R (group rank 0's count, for every node)
//   r<R>/master      "<addr> <port>": the workers' MASTER_ADDR / MASTER_PORT
//   r<R>/failure     why the round ended (compare_set: first wins): a failure summary, or
//                    kMembershipChange + reason when it ended to admit waiting nodes
//   r<R>/waiting     counter of nodes that came after round R closed, waiting for R+1
//   r<R>/alive/<g>   group rank g's keep-alive counter (Note [Agent keep-alives])
//   r<R>/done        counter of nodes whose workers all succeeded
//   secret           the workers' store secret (when the launcher made one)
//   abort            a launcher was interrupted: every node stops without restarting
//   exit             counter of launchers that finished (node 0 waits before closing)

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "tdist/error.h"
#include "tdist/launch/launch_config.h"
#include "tdist/store/store.h"

// Note [Agent keep-alives]: while a round runs, every agent of a store rendezvous adds 1 to
// r<R>/alive/<g> every keep_alive_interval and reads the other nodes' counters (torchelastic's
// keep-alives, through the same store). A counter that has not moved for
// keep_alive_max_attempt intervals means that node's launcher stopped or its host vanished
// or lost its network without closing a socket (a node that ends normally reports first): the
// agent that sees it reports a failure naming the node and host, which ends the round on every
// node and restarts it as any failure does (--max-restarts). The store's own host falling
// silent shows as store requests unanswered for the same time (the requests' timeout during
// the round): those agents stop their workers and end with an error naming it, since no
// restart can meet without it. Workers watch each other on their own (TDIST_HEARTBEAT_*).
//
// Note [Late joiners]: with --nnodes MIN:MAX (c10d), a node that comes after round R closed
// with fewer than MAX nodes adds itself to r<R>/waiting and waits for round R+1 to open.
// The running agents poll that counter every --monitor-interval; the first to see it while
// its own workers still run ends round R for a membership change (through r<R>/failure, so
// that a failure and a membership change cannot both end the round), every node stops its
// workers, and all of them, the newcomer included, join round R+1. A membership change
// does not count against --max-restarts (torchelastic's num_nodes_waiting). A node that
// finds the round full (MAX nodes) is refused, as is any late node of a static rendezvous.

namespace tdist::launch {

/// A launcher was interrupted (SIGINT/SIGTERM) while waiting for the others.
class Interrupted : public Error {
 public:
  using Error::Error;
};

/// What a keep-alive found wrong (Note [Agent keep-alives]); empty when nothing.
struct KeepAliveProblem {
  std::string what;         // names the silent node, or the silent store
  bool store_lost = false;  // the store itself stopped answering: no restart can meet
  bool empty() const { return what.empty(); }
};

struct RendezvousInfo {
  int round = 0;
  /// Failure restarts before this round (TORCHELASTIC_RESTART_COUNT), as group rank 0
  /// counts them, so that a node that joined late agrees with the others.
  int restart_count = 0;
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
  /// Joins round `round`, or a later one when this node comes late (Note [Late joiners]);
  /// blocks until the round is complete (or join_timeout: TimeoutError, or `interrupted()`
  /// turned true: Interrupted). `restarts`: this node's count of failure restarts so far
  /// (group rank 0 publishes its own for everyone).
  virtual RendezvousInfo join(int round, int restarts) = 0;
  /// Records this node's failure in `round`; the first report of a round wins.
  virtual void report_failure(int round, const std::string& summary) = 0;
  /// Never blocks: true once any node reported a failure in `round`, or aborted.
  virtual bool failure_reported(int round) = 0;
  /// The first failure reported in `round` ("" if none).
  virtual std::string failure(int round) = 0;
  /// Never blocks: how many nodes wait to join after `round` (0 unless elastic c10d).
  virtual int nodes_waiting(int round) = 0;
  /// Ends `round` to admit the waiting nodes, unless a failure ended it first.
  virtual void request_rejoin(int round, const std::string& reason) = 0;
  /// Beats for this node and checks the others (Note [Agent keep-alives]); cheap to call
  /// often (it acts once per keep_alive_interval). Never throws.
  virtual KeepAliveProblem keep_alive(const RendezvousInfo&) { return {}; }
  /// The problem to report when a store request failed while the round ran (`error`).
  virtual KeepAliveProblem lost_store(const std::string& error) { return {error, true}; }
  /// True when `round` ended for a membership change rather than a failure.
  bool membership_changed(int round) { return failure(round).rfind(kMembershipChange, 0) == 0; }
  virtual void report_success(int round) = 0;
  /// Never blocks: true once every node of `round` reported success.
  virtual bool all_succeeded(int round) = 0;
  /// Tells every node to stop without restarting.
  virtual void abort(const std::string& reason) = 0;
  /// Never blocks: the abort reason, "" if nobody aborted.
  virtual std::string aborted() = 0;
  /// At exit; the node hosting the store waits (bounded) until the others are done with it.
  virtual void shutdown(bool quick) = 0;

  /// How r<R>/failure starts when a round ended for a membership change.
  static constexpr const char* kMembershipChange = "membership change: ";

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
  RendezvousInfo join(int round, int restarts) override;
  void report_failure(int round, const std::string& summary) override;
  bool failure_reported(int round) override;
  std::string failure(int round) override;
  int nodes_waiting(int) override { return 0; }
  void request_rejoin(int, const std::string&) override {}
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
  RendezvousInfo join(int round, int restarts) override;
  void report_failure(int round, const std::string& summary) override;
  bool failure_reported(int round) override;
  std::string failure(int round) override;
  int nodes_waiting(int round) override;
  void request_rejoin(int round, const std::string& reason) override;
  void report_success(int round) override;
  bool all_succeeded(int round) override;
  void abort(const std::string& reason) override;
  std::string aborted() override;
  void shutdown(bool quick) override;
  KeepAliveProblem keep_alive(const RendezvousInfo& info) override;
  KeepAliveProblem lost_store(const std::string& error) override;

 private:
  std::string key(const std::string& name) const { return prefix_ + name; }
  /// The keep-alive counters last read, per group rank, and when each last moved.
  struct KeepAliveWatch {
    int round = -1;
    std::chrono::steady_clock::time_point last_beat;
    std::vector<int64_t> counts;
    std::vector<std::chrono::steady_clock::time_point> moved;
  };
  KeepAliveProblem check_peers(const RendezvousInfo& info);
  std::string round_key(int round, const std::string& name) const;
  /// Elastic c10d: a node that comes late waits for the next round (Note [Late joiners]).
  bool admits_late_nodes() const;
  /// The round group rank 0 opened last (0 before it opened any).
  int current_round();
  int take_group_rank(int round);
  int close_round(int round, int restarts);  // group rank 0 only: decides membership
  /// Registers this node as waiting after `round` and returns the round opened next.
  int wait_for_next_round(int round);
  /// Throws when `round` was the job's last: nobody will open another one.
  void check_job_goes_on(int round);
  RendezvousInfo round_info(int round, int group_rank);
  /// r<R>/node/<g>: what a node said of itself when it joined.
  struct NodeEntry {
    int nproc = 0;
    std::string host;
  };
  NodeEntry node_entry(int round, int group_rank);
  void wait_for(const std::vector<std::string>& keys, const std::string& what);

  StorePtr store_;
  LaunchConfig config_;
  bool is_host_;
  std::string prefix_;
  int nodes_in_round_ = 0;
  KeepAliveWatch watch_;
};

/// False when the launcher must not make a workers' store secret
/// (disabled, or the environment already carries TDIST_STORE_SECRET / _FILE).
bool should_make_store_secret(const LaunchConfig& config);

}  // namespace tdist::launch

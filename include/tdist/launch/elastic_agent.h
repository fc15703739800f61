#pragma once

// The per-node agent: joins each round of the rendezvous, starts this node's workers with
// the environment contract, forwards their output, and on a failure anywhere stops them
// and restarts the round, up to --max-restarts. A node waiting to join an elastic job also
// restarts the round, without counting (Note [Late joiners] in rendezvous.h).

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tdist/launch/launch_config.h"
#include "tdist/launch/rendezvous.h"
#include "tdist/launch/worker_group.h"

namespace tdist::launch {

class ElasticAgent {
 public:
  ElasticAgent(LaunchConfig config, Rendezvous& rendezvous);
  ~ElasticAgent();
  ElasticAgent(const ElasticAgent&) = delete;
  ElasticAgent& operator=(const ElasticAgent&) = delete;

  /// Runs the job to its end; returns tdistrun's exit code (0 success, 1 failure,
  /// 128 + signal when interrupted).
  int run();

  /// The environment of one worker (the launcher's own, plus the contract).
  std::vector<std::string> worker_env(const RendezvousInfo& info, int local_rank) const;
  std::vector<WorkerSpec> worker_specs(const RendezvousInfo& info) const;

 private:
  // kEnded: a failure or a membership change ended the round (the rendezvous says which).
  // kStoreLost: the rendezvous store stopped answering (Note [Agent keep-alives]).
  enum class Outcome { kSucceeded, kEnded, kInterrupted, kStoreLost };
  /// How long a failure that names a lost peer waits for that peer's own failure.
  static constexpr std::chrono::milliseconds kCauseWait{2000};
  Outcome run_round(const RendezvousInfo& info, const std::string& program);
  /// The round's periodic look at the rendezvous: keep-alives, failures, late nodes, the
  /// outcome. nullopt: the round goes on.
  std::optional<Outcome> check_round(WorkerGroup& group, const RendezvousInfo& info,
                                     bool reported_success, const std::function<bool()>& force);
  /// Ends the round for a silent node or store (Note [Agent keep-alives]).
  Outcome end_for_silence(WorkerGroup& group, const RendezvousInfo& info,
                          const KeepAliveProblem& problem, const std::function<bool()>& force);
  /// True when a node waits to join and this round has room for it (Note [Late joiners]).
  bool node_waiting_with_room(const RendezvousInfo& info);
  /// The worker to name as the round's first failure (Note [Blaming the lost peer]).
  const WorkerStatus& find_cause(WorkerGroup& group, const RendezvousInfo& info);
  std::string describe_failure(const RendezvousInfo& info, const WorkerStatus& failed) const;
  void write_secret_file(const std::string& secret);
  /// Leaves the rendezvous; errors (node 0 already gone) are only reported.
  void leave(bool quick);
  const std::string& run_dir();
  /// Sets OPENBLAS_CORETYPE for the workers when the system's OpenBLAS would fall back to its
  /// generic kernels on this CPU (and the user has not set it).
  void choose_openblas_kernels();
  /// --numa-binding: computes each local rank's CPUs once (the topology does not change
  /// between attempts) and says where they go.
  void bind_to_numa_nodes();

  LaunchConfig config_;
  Rendezvous& rendezvous_;
  std::map<std::string, std::string> base_env_;
  std::string run_dir_;      // private 0700 directory for the secret file, removed at exit
  std::string secret_file_;  // TDIST_STORE_SECRET_FILE for the workers
  std::string log_root_;     // where per-rank logs go ("" when none)
  std::vector<std::set<int>> cpu_sets_;  // per local rank; empty: no --numa-binding
  int signal_ = 0;                       // the terminating signal received, 0 if none
};

}  // namespace tdist::launch

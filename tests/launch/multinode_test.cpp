// Several tdistrun launchers forming one job: as two "nodes" on this machine, and as two
// hosts in separate network namespaces joined by a veth pair (when permitted).
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>

#include "launch/netns_pair.h"
#include "launch/run_process.h"

namespace tdist::launch::testing {
namespace {

using std::chrono::seconds;

std::vector<std::string> node(const std::vector<std::string>& flags,
                              const std::vector<std::string>& worker_args,
                              const std::vector<std::string>& wrapper = {}) {
  std::vector<std::string> argv = wrapper;
  argv.push_back(tdistrun());
  for (const char* a : {"--monitor-interval", "0.05", "--stop-timeout", "3", "--rdzv-conf",
                        "join_timeout=30,close_timeout=10"}) {
    argv.push_back(a);
  }
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(worker());
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

struct WorldView {
  std::set<int> ranks;
  std::set<std::string> world_sizes, master_addrs, master_ports, secrets, groups;
};

// Every rank printed by any launcher, with the values that must agree across nodes.
void collect(const std::string& out, int max_rank, WorldView* view) {
  for (int rank = 0; rank <= max_rank; ++rank) {
    std::string r = env_of(out, rank, "RANK");
    if (r.empty()) continue;
    EXPECT_EQ(r, std::to_string(rank));
    EXPECT_TRUE(view->ranks.insert(rank).second) << "rank " << rank << " started twice";
    view->world_sizes.insert(env_of(out, rank, "WORLD_SIZE"));
    view->master_addrs.insert(env_of(out, rank, "MASTER_ADDR"));
    view->master_ports.insert(env_of(out, rank, "MASTER_PORT"));
    view->groups.insert(env_of(out, rank, "GROUP_RANK"));
    auto secret = lines_with(out, "[rank " + std::to_string(rank) + "]: SECRET=");
    if (!secret.empty()) view->secrets.insert(secret[0].substr(secret[0].find('=') + 1));
  }
}

TEST(TdistrunMultiNode, TwoLaunchersByJoinOrderFormOneWorld) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_tcp_port());
  Proc a(node(
      {"--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", endpoint, "--rdzv-id", "pair"},
      {"--print-env"}));
  Proc b(node(
      {"--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", endpoint, "--rdzv-id", "pair"},
      {"--print-env"}));
  auto ra = a.wait(seconds(60)), rb = b.wait(seconds(60));
  ASSERT_EQ(ra.exit_code, 0) << describe(ra);
  ASSERT_EQ(rb.exit_code, 0) << describe(rb);
  WorldView view;
  collect(ra.out, 2, &view);
  collect(rb.out, 2, &view);
  EXPECT_EQ(view.ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(view.world_sizes, (std::set<std::string>{"3"}));
  EXPECT_EQ(view.master_addrs, (std::set<std::string>{"127.0.0.1"}));
  EXPECT_EQ(view.master_ports.size(), 1u);
  EXPECT_EQ(view.groups, (std::set<std::string>{"0", "1"}));
  EXPECT_EQ(view.secrets.size(), 1u) << "every node's workers must share one store secret";
}

std::vector<std::string> static_node(int node_rank, int port,
                                     const std::string& addr = "127.0.0.1") {
  return {"--nnodes",         "2",
          "--nproc-per-node", "2",
          "--node-rank",      std::to_string(node_rank),
          "--master-addr",    addr,
          "--master-port",    std::to_string(port)};
}

TEST(TdistrunMultiNode, StaticNodeRanksAndAFailureRestartsEveryNode) {
  int port = free_tcp_port();
  std::vector<std::string> worker_args = {"--print-env", "--fail-rank", "3",
                                          "--exit",      "7",           "--fail-until-restart",
                                          "1",           "--sleep",     "0.5"};
  auto flags1 = static_node(1, port), flags0 = static_node(0, port);
  for (auto* f : {&flags0, &flags1}) {
    f->push_back("--max-restarts");
    f->push_back("1");
  }
  Proc b(node(flags1, worker_args));  // the client may start first: it waits for node 0
  Proc a(node(flags0, worker_args));
  auto ra = a.wait(seconds(60)), rb = b.wait(seconds(60));
  ASSERT_EQ(ra.exit_code, 0) << describe(ra);
  ASSERT_EQ(rb.exit_code, 0) << describe(rb);
  // Node 0 holds ranks 0,1 and node 1 ranks 2,3, in both attempts.
  for (int rank : {0, 1}) {
    auto counts =
        lines_with(ra.out, "[rank " + std::to_string(rank) + "]: ENV TORCHELASTIC_RESTART_COUNT=");
    ASSERT_EQ(counts.size(), 2u) << "node 0 must restart too:\n" << ra.out;
    EXPECT_EQ(counts[1].back(), '1');
  }
  EXPECT_EQ(lines_with(rb.out, "[rank 3]: ENV RANK=3").size(), 2u) << rb.out;
  EXPECT_NE(ra.err.find("restarting the workers"), std::string::npos) << ra.err;
  EXPECT_NE(ra.err.find("rank 3"), std::string::npos) << "node 0 names the remote failure";
}

TEST(TdistrunMultiNode, FinalFailureIsReportedOnEveryNode) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_tcp_port());
  std::vector<std::string> flags = {"--nnodes", "2", "--rdzv-endpoint", endpoint};
  std::vector<std::string> worker_args = {"--fail-rank",    "1",         "--exit",  "9", "--stderr",
                                          "remote trouble", "--on-term", "--sleep", "60"};
  Proc a(node(flags, worker_args));
  Proc b(node(flags, worker_args));
  auto ra = a.wait(seconds(60)), rb = b.wait(seconds(60));
  for (const auto* r : {&ra, &rb}) {
    EXPECT_EQ(r->exit_code, 1) << describe(*r);
    EXPECT_NE(r->err.find("first failure: rank 1"), std::string::npos) << r->err;
    EXPECT_NE(r->err.find("exited with code 9"), std::string::npos) << r->err;
    EXPECT_NE(r->err.find("remote trouble"), std::string::npos) << r->err;
  }
}

// Note [Blaming the lost peer] across nodes: every other rank aborts at once after losing
// rank 2, which fails 0.6 s later on node 1; node 0 waits for node 1's report of it.
TEST(TdistrunMultiNode, TheRankOthersLostIsNamedOnEveryNode) {
  int port = free_tcp_port();
  std::vector<std::string> worker_args = {"--fail-rank",  "2",   "--exit",   "9",
                                          "--fail-delay", "0.6", "--stderr", "remote trouble",
                                          "--cascade"};
  Proc b(node(static_node(1, port), worker_args));
  Proc a(node(static_node(0, port), worker_args));
  auto ra = a.wait(seconds(60)), rb = b.wait(seconds(60));
  for (const auto* r : {&ra, &rb}) {
    EXPECT_EQ(r->exit_code, 1) << describe(*r);
    EXPECT_NE(r->err.find("first failure: rank 2"), std::string::npos) << r->err;
    EXPECT_NE(r->err.find("exited with code 9"), std::string::npos) << r->err;
    EXPECT_NE(r->err.find("[rank 2]: remote trouble"), std::string::npos) << r->err;
  }
}

TEST(TdistrunMultiNode, SignalToOneLauncherStopsEveryNodeWithoutRestart) {
  int port = free_tcp_port();
  std::string dir = temp_dir();
  std::vector<std::string> worker_args = {"--pid-dir", dir, "--on-term", "--sleep", "60"};
  auto flags0 = static_node(0, port), flags1 = static_node(1, port);
  for (auto* f : {&flags0, &flags1}) {
    f->push_back("--max-restarts");
    f->push_back("3");
  }
  Proc a(node(flags0, worker_args));
  Proc b(node(flags1, worker_args));
  auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (std::chrono::steady_clock::now() < deadline &&
         std::distance(std::filesystem::directory_iterator(dir),
                       std::filesystem::directory_iterator()) < 4) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  b.kill(SIGTERM);
  auto rb = b.wait(seconds(30)), ra = a.wait(seconds(30));
  EXPECT_EQ(rb.exit_code, 128 + SIGTERM) << describe(rb);
  EXPECT_EQ(ra.exit_code, 1) << describe(ra);
  EXPECT_NE(ra.err.find("node 1"), std::string::npos) << ra.err;
  EXPECT_NE(ra.err.find("got SIGTERM"), std::string::npos) << ra.err;
  EXPECT_EQ(ra.err.find("restarting"), std::string::npos) << "an interrupt is not a failure";
  EXPECT_EQ(lines_with(ra.out, "[rank 0]: rank 0 got SIGTERM").size(), 1u) << ra.out;
  EXPECT_EQ(lines_with(rb.out, "[rank 2]: rank 2 got SIGTERM").size(), 1u) << rb.out;
}

TEST(TdistrunMultiNode, MissingNodeTimesOutClearly) {
  int port = free_tcp_port();
  auto argv = node(static_node(0, port), {"--print-env"});
  argv[6] = "join_timeout=1";  // --rdzv-conf
  auto r = run(argv, {}, seconds(30));
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("2 nodes to join round 0"), std::string::npos) << r.err;
}

// Note [Late joiners]: node A runs alone (--nnodes 1:2) until node B comes; A's agent then
// stops its worker and both restart at 2 nodes, with --max-restarts 0 (a membership change
// is not a restart).
TEST(TdistrunMultiNode, LateNodeJoinsARunningElasticJob) {
  std::string endpoint = "127.0.0.1:" + std::to_string(free_tcp_port());
  std::vector<std::string> flags = {"--nnodes",        "1:2",    "--nproc-per-node", "1",
                                    "--rdzv-endpoint", endpoint, "--rdzv-id",        "late",
                                    "--max-restarts",  "0"};
  // Workers below world size 2 wait until stopped.
  std::vector<std::string> worker_args = {"--print-env", "--wait-for-world", "2"};
  auto argv = node(flags, worker_args);
  argv[6] = "join_timeout=30,close_timeout=10,last_call_timeout=0.3";  // --rdzv-conf
  Proc a(argv);
  auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (std::chrono::steady_clock::now() < deadline &&
         lines_with(a.out_so_far(), "[rank 0]: ENV WORLD_SIZE=1").empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(lines_with(a.out_so_far(), "[rank 0]: ENV WORLD_SIZE=1").empty())
      << "node A never ran alone:\n"
      << a.out_so_far() << a.err_so_far();
  Proc b(argv);
  auto ra = a.wait(seconds(60)), rb = b.wait(seconds(60));
  ASSERT_EQ(ra.exit_code, 0) << describe(ra);
  ASSERT_EQ(rb.exit_code, 0) << describe(rb);
  WorldView view;
  collect(ra.out, 1, &view);
  collect(rb.out, 1, &view);
  EXPECT_EQ(view.ranks, (std::set<int>{0, 1}));
  EXPECT_EQ(lines_with(ra.out, "[rank 0]: ENV WORLD_SIZE=").size(), 2u) << ra.out;
  EXPECT_EQ(lines_with(ra.out, "[rank 0]: ENV WORLD_SIZE=2").size(), 1u) << ra.out;
  EXPECT_EQ(lines_with(rb.out, "[rank 1]: ENV WORLD_SIZE=2").size(), 1u) << rb.out;
  EXPECT_EQ(lines_with(rb.out, "[rank 1]: ENV GROUP_RANK=1").size(), 1u) << rb.out;
  EXPECT_EQ(lines_with(ra.out, "[rank 0]: rank 0 done").size(), 1u) << ra.out;
  EXPECT_EQ(lines_with(rb.out, "[rank 1]: rank 1 done").size(), 1u) << rb.out;
  for (const auto* r : {&ra, &rb}) {
    for (const auto& line : lines_with(r->out, "[rank ")) {
      if (line.find("TORCHELASTIC_RESTART_COUNT=") != std::string::npos) {
        EXPECT_EQ(line.back(), '0') << "a membership change is not a restart: " << line;
      }
    }
  }
  // ... but the workers learn they were restarted (the trainer resumes on it).
  EXPECT_EQ(lines_with(ra.out, "[rank 0]: ENV TDIST_ELASTIC_ROUND=0").size(), 1u) << ra.out;
  EXPECT_EQ(lines_with(ra.out, "[rank 0]: ENV TDIST_ELASTIC_ROUND=1").size(), 1u) << ra.out;
  EXPECT_EQ(lines_with(rb.out, "[rank 1]: ENV TDIST_ELASTIC_ROUND=1").size(), 1u) << rb.out;
  EXPECT_EQ(lines_with(ra.err, "tdistrun: node joined; restarting the workers at 2 nodes").size(),
            1u)
      << ra.err;
  EXPECT_NE(rb.err.find("waiting for its nodes to restart their workers"), std::string::npos)
      << rb.err;
  EXPECT_EQ(ra.err.find("restarting the workers (restart"), std::string::npos) << ra.err;
}

// Note [Agent keep-alives]: two static nodes whose workers run until stopped, keep-alives
// every TDIST_KEEP_ALIVE_TEST_INTERVAL seconds (default 0.2), 5 missed allowed. The benchmark
// row of bench/RESULTS.md runs these with the default interval (1) and
// TDIST_KEEP_ALIVE_TRIALS=20; each trial prints how long the naming took.
std::string keep_alive_interval() {
  const char* v = std::getenv("TDIST_KEEP_ALIVE_TEST_INTERVAL");
  return v != nullptr && *v != '\0' ? v : "0.2";
}

int keep_alive_trials() {
  const char* v = std::getenv("TDIST_KEEP_ALIVE_TRIALS");
  return v != nullptr && *v != '\0' ? std::max(1, std::atoi(v)) : 1;
}

std::vector<std::string> keep_alive_node(int node_rank, int port) {
  auto argv = node(static_node(node_rank, port), {"--print-env", "--on-term", "--sleep", "600"});
  argv[6] = "join_timeout=30,close_timeout=2,keep_alive_interval=" + keep_alive_interval() +
            ",keep_alive_max_attempt=5";
  return argv;
}

void wait_until_both_run(Proc& a, Proc& b) {
  auto deadline = std::chrono::steady_clock::now() + seconds(30);
  auto running = [](Proc& p, int rank) {
    return p.out_so_far().find("[rank " + std::to_string(rank) + "]") != std::string::npos;
  };
  while (std::chrono::steady_clock::now() < deadline && !(running(a, 0) && running(b, 2))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// One keep-alive trial: both nodes run, then node `stopped_rank`'s launcher is stopped
/// (SIGSTOP: no socket closed) until the other's stderr holds `named` (or 60 s), then both
/// end (the stopped one continued once the other has).
struct KeepAliveTrial {
  double seconds_to_named = 0;
  ProcResult watcher, stopped;
};

KeepAliveTrial run_keep_alive_trial(int stopped_rank, const std::string& named) {
  const int port = free_tcp_port();
  Proc a(keep_alive_node(0, port));
  Proc b(keep_alive_node(1, port));
  wait_until_both_run(a, b);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Proc& stopped = stopped_rank == 0 ? a : b;
  Proc& watcher = stopped_rank == 0 ? b : a;
  stopped.kill(SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < seconds(60) &&
         watcher.err_so_far().find(named) == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  KeepAliveTrial trial;
  trial.seconds_to_named =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  trial.watcher = watcher.wait(seconds(30));
  stopped.kill(SIGCONT);
  trial.stopped = stopped.wait(seconds(30));
  return trial;
}

// A node's launcher stops (its workers left running): node 0 names it and ends the job.
TEST(TdistrunMultiNode, AStoppedLauncherIsNamedByKeepAlives) {
  for (int i = 0; i < keep_alive_trials(); ++i) {
    const KeepAliveTrial trial = run_keep_alive_trial(1, "sent no keep-alive for");
    std::cout << "keep-alive trial " << i << ": stopped launcher named after "
              << trial.seconds_to_named << " s\n";
    const ProcResult& ra = trial.watcher;
    const ProcResult& rb = trial.stopped;
    EXPECT_FALSE(ra.timed_out) << describe(ra);
    EXPECT_EQ(ra.exit_code, 1) << describe(ra);
    EXPECT_NE(ra.err.find("node 1 (host "), std::string::npos) << ra.err;
    EXPECT_NE(ra.err.find("sent no keep-alive for"), std::string::npos) << ra.err;
    EXPECT_NE(ra.err.find("noticed by node 0"), std::string::npos) << ra.err;
    EXPECT_FALSE(rb.timed_out) << describe(rb);
    EXPECT_NE(rb.exit_code, 0) << describe(rb);
  }
}

// The launcher hosting the rendezvous store stops: the other node names the store.
TEST(TdistrunMultiNode, AStoppedStoreHostIsNamedByKeepAlives) {
  for (int i = 0; i < keep_alive_trials(); ++i) {
    const KeepAliveTrial trial = run_keep_alive_trial(0, "the rendezvous store at 127.0.0.1:");
    std::cout << "keep-alive trial " << i << ": stopped store host named after "
              << trial.seconds_to_named << " s\n";
    const ProcResult& rb = trial.watcher;
    const ProcResult& ra = trial.stopped;
    EXPECT_FALSE(rb.timed_out) << describe(rb);
    EXPECT_EQ(rb.exit_code, 1) << describe(rb);
    EXPECT_NE(rb.err.find("did not answer within"), std::string::npos) << rb.err;
    EXPECT_NE(rb.err.find("no restart can meet without the rendezvous store"), std::string::npos)
        << rb.err;
    EXPECT_FALSE(ra.timed_out) << describe(ra);
  }
}

TEST_F(NetnsPair, TwoHostsFormOneWorld) {
  const int port = 29555;  // each namespace has its own ports
  Proc b(node(static_node(1, port, addr_[0]), {"--print-env"}, in_ns(1)));
  Proc a(node(static_node(0, port, addr_[0]), {"--print-env"}, in_ns(0)));
  auto ra = a.wait(seconds(60)), rb = b.wait(seconds(60));
  ASSERT_EQ(ra.exit_code, 0) << describe(ra);
  ASSERT_EQ(rb.exit_code, 0) << describe(rb);
  WorldView view;
  collect(ra.out, 3, &view);
  collect(rb.out, 3, &view);
  EXPECT_EQ(view.ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(view.world_sizes, (std::set<std::string>{"4"}));
  EXPECT_EQ(view.master_addrs, (std::set<std::string>{addr_[0]}));
  EXPECT_EQ(view.master_ports.size(), 1u);
  EXPECT_EQ(view.secrets.size(), 1u);
  EXPECT_EQ(lines_with(rb.out, "[rank 2]: ENV GROUP_RANK=1").size(), 1u) << rb.out;
}

}  // namespace
}  // namespace tdist::launch::testing

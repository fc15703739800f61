#include <gtest/gtest.h>

#include "tdist/launch/launch_config.h"

namespace tdist::launch {
namespace {

ParsedArgs parse(std::vector<std::string> args) {
  args.insert(args.begin(), "tdistrun");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  return parse_launch_args(static_cast<int>(argv.size()), argv.data());
}

TEST(LaunchConfig, TorchrunFlagsBothSpellings) {
  auto p = parse({"--nproc-per-node", "3", "--nnodes=2", "--node_rank", "1", "--master-addr",
                  "10.1.2.3", "--master_port", "1234", "--max-restarts", "2", "--monitor-interval",
                  "0.5", "--rdzv-id", "job", "./train", "--lr", "0.1"});
  ASSERT_TRUE(p.config) << p.message;
  const auto& c = *p.config;
  EXPECT_EQ(c.nproc_per_node, 3);
  EXPECT_EQ(c.min_nodes, 2);
  EXPECT_EQ(c.max_nodes, 2);
  EXPECT_EQ(c.node_rank, 1);
  EXPECT_EQ(c.master_addr, "10.1.2.3");
  EXPECT_EQ(c.master_port, 1234);
  EXPECT_TRUE(c.master_port_given);
  EXPECT_EQ(c.max_restarts, 2);
  EXPECT_EQ(c.monitor_interval.count(), 500);
  EXPECT_EQ(c.rdzv_id, "job");
  EXPECT_EQ(c.rendezvous_mode(), RendezvousMode::kStatic);
  EXPECT_EQ(c.rdzv_host, "10.1.2.3");  // static: the store lives at master addr:port
  EXPECT_EQ(c.rdzv_port, 1234);
  EXPECT_EQ(c.program, "./train");
  // Everything after the program belongs to the program, even launcher-like flags.
  EXPECT_EQ(c.args, (std::vector<std::string>{"--lr", "0.1"}));
}

TEST(LaunchConfig, ProgramArgsThatLookLikeLauncherFlags) {
  auto p = parse({"--standalone", "prog", "--nproc-per-node", "9", "--", "x"});
  ASSERT_TRUE(p.config) << p.message;
  EXPECT_EQ(p.config->nproc_per_node, 1);
  EXPECT_EQ(p.config->args, (std::vector<std::string>{"--nproc-per-node", "9", "--", "x"}));
  auto dashdash = parse({"--nproc-per-node", "2", "--", "prog", "a"});
  ASSERT_TRUE(dashdash.config) << dashdash.message;
  EXPECT_EQ(dashdash.config->program, "prog");
}

TEST(LaunchConfig, ElasticNnodesAndEndpoint) {
  auto p = parse({"--nnodes", "1:4", "--rdzv-endpoint", "node7:5555", "prog"});
  ASSERT_TRUE(p.config) << p.message;
  EXPECT_EQ(p.config->min_nodes, 1);
  EXPECT_EQ(p.config->max_nodes, 4);
  EXPECT_TRUE(p.config->is_elastic());
  EXPECT_EQ(p.config->rendezvous_mode(), RendezvousMode::kDynamic);
  EXPECT_EQ(p.config->rdzv_host, "node7");
  EXPECT_EQ(p.config->rdzv_port, 5555);
  auto v6 = parse({"--nnodes", "2", "--rdzv-endpoint", "[::1]:7", "prog"});
  ASSERT_TRUE(v6.config) << v6.message;
  EXPECT_EQ(v6.config->rdzv_host, "::1");
  EXPECT_EQ(v6.config->rdzv_port, 7);
  auto default_port = parse({"--nnodes", "2", "--rdzv-endpoint", "node7", "prog"});
  ASSERT_TRUE(default_port.config);
  EXPECT_EQ(default_port.config->rdzv_port, 29400);
}

TEST(LaunchConfig, NprocAutoIsAtLeastOne) {
  auto p = parse({"--nproc-per-node", "auto", "prog"});
  ASSERT_TRUE(p.config) << p.message;
  EXPECT_GE(p.config->nproc_per_node, 1);
  EXPECT_EQ(resolve_nproc("cpu"), p.config->nproc_per_node);
}

TEST(LaunchConfig, RedirectsAndTee) {
  auto p = parse({"--redirects", "3", "--tee", "0:1,2:2", "--log-dir", "/tmp/x", "prog"});
  ASSERT_TRUE(p.config) << p.message;
  EXPECT_TRUE(p.config->redirects.selects(5, StreamSelection::kStdout));
  EXPECT_TRUE(p.config->redirects.selects(5, StreamSelection::kStderr));
  EXPECT_TRUE(p.config->tee.selects(0, StreamSelection::kStdout));
  EXPECT_FALSE(p.config->tee.selects(0, StreamSelection::kStderr));
  EXPECT_TRUE(p.config->tee.selects(2, StreamSelection::kStderr));
  EXPECT_FALSE(p.config->tee.selects(1, StreamSelection::kStdout));
}

TEST(LaunchConfig, NumaBindingBothSpellings) {
  EXPECT_EQ(parse({"p"}).config->numa_binding, NumaBinding::kNone);
  EXPECT_EQ(parse({"--numa-binding", "socket", "p"}).config->numa_binding, NumaBinding::kSocket);
  EXPECT_EQ(parse({"--numa_binding=core-complex", "p"}).config->numa_binding,
            NumaBinding::kCoreComplex);
}

TEST(LaunchConfig, RdzvConfTimeouts) {
  auto p = parse({"--nnodes", "2", "--rdzv-endpoint", "h:1", "--rdzv-conf",
                  "join_timeout=2.5,last_call_timeout=1,read_timeout=9", "prog"});
  ASSERT_TRUE(p.config) << p.message;
  EXPECT_EQ(p.config->join_timeout.count(), 2500);
  EXPECT_EQ(p.config->last_call_timeout.count(), 1000);
  EXPECT_EQ(p.config->keep_alive_interval.count(), 1000);  // Note [Agent keep-alives]
  EXPECT_EQ(p.config->keep_alive_max_attempt, 5);
  p = parse({"--nnodes", "2", "--rdzv-endpoint", "h:1", "--rdzv-conf",
             "keep_alive_interval=0.25,keep_alive_max_attempt=3", "prog"});
  ASSERT_TRUE(p.config) << p.message;
  EXPECT_EQ(p.config->keep_alive_interval.count(), 250);
  EXPECT_EQ(p.config->keep_alive_max_attempt, 3);
  for (const char* bad :
       {"keep_alive_max_attempt=0", "keep_alive_max_attempt=2.5", "keep_alive_interval=0"}) {
    p = parse({"--nnodes", "2", "--rdzv-endpoint", "h:1", "--rdzv-conf", bad, "prog"});
    EXPECT_FALSE(p.config) << bad;
    EXPECT_NE(p.message.find(std::string(bad).substr(0, std::string(bad).find('='))),
              std::string::npos)
        << p.message;
  }
}

TEST(LaunchConfig, UsageErrorsExplainThemselves) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  } cases[] = {
      {{}, "no program"},
      {{"--nproc-per-node", "0", "p"}, "at least 1"},
      {{"--nproc-per-node", "lots", "p"}, "--nproc-per-node"},
      {{"--nnodes", "3:2", "p"}, "MIN <= MAX"},
      {{"--nnodes", "2", "--node-rank", "2", "p"}, "--node-rank 2"},
      {{"--nnodes", "1:2", "p"}, "c10d"},
      {{"--standalone", "--nnodes", "2", "p"}, "--standalone"},
      {{"--redirects", "7", "p"}, "--redirects"},
      {{"--rdzv-backend", "etcd", "p"}, "static or c10d"},
      {{"--bogus", "p"}, "--bogus"},
      {{"-m", "p"}, "not supported"},
      // Found by fuzz/launch_args_fuzzer.cpp: an empty program was accepted.
      {{"--nproc-per-node", "2", "", "x"}, "empty string"},
      {{"--numa-binding", "numa", "p"},
       "--numa-binding must be node, socket, exclusive or core-complex, got 'numa'"},
      {{"--numa-binding", "node", "--launcher", "mpirun", "p"}, "needs --launcher fork"},
  };
  for (const auto& c : cases) {
    auto p = parse(c.args);
    EXPECT_FALSE(p.config);
    EXPECT_EQ(p.exit_code, 2);
    EXPECT_NE(p.message.find(c.expect), std::string::npos)
        << "message '" << p.message << "' should mention '" << c.expect << "'";
  }
}

TEST(LaunchConfig, HelpListsTheFlags) {
  auto p = parse({"--help"});
  EXPECT_FALSE(p.config);
  EXPECT_EQ(p.exit_code, 0);
  for (const char* flag :
       {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
        "--rdzv-endpoint", "--rdzv-id", "--standalone", "--max-restarts", "--monitor-interval",
        "--log-dir", "--redirects", "--tee", "--numa-binding", "TORCHELASTIC_RESTART_COUNT"}) {
    EXPECT_NE(p.message.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace tdist::launch

// StoreRendezvous with nodes as threads over one HashStore: rank assignment, restarts and
// failures, without any process or socket.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "tdist/launch/rendezvous.h"
#include "tdist/store/hash_store.h"

namespace tdist::launch {
namespace {

LaunchConfig node_config(int nnodes_min, int nnodes_max, int nproc, const std::string& backend,
                         int node_rank = 0) {
  LaunchConfig c;
  c.min_nodes = nnodes_min;
  c.max_nodes = nnodes_max;
  c.nproc_per_node = nproc;
  c.rdzv_backend = backend;
  c.node_rank = node_rank;
  c.rdzv_host = "127.0.0.1";
  c.rdzv_id = "t";
  c.join_timeout = std::chrono::seconds(20);
  c.last_call_timeout = std::chrono::milliseconds(300);
  c.store_secret = true;
  return c;
}

// Runs `nodes` rendezvous on threads; node i uses nprocs[i] workers.
std::vector<RendezvousInfo> join_all(const std::vector<LaunchConfig>& configs,
                                     std::vector<std::unique_ptr<StoreRendezvous>>* keep,
                                     StorePtr store, int round = 0) {
  std::vector<RendezvousInfo> infos(configs.size());
  std::vector<std::thread> threads;
  std::vector<std::string> errors(configs.size());
  if (keep->empty()) {
    for (size_t i = 0; i < configs.size(); ++i) {
      keep->push_back(std::make_unique<StoreRendezvous>(store, configs[i], i == 0));
    }
  }
  for (size_t i = 0; i < configs.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        infos[i] = (*keep)[i]->join(round, 0);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < errors.size(); ++i) EXPECT_EQ(errors[i], "") << "node " << i;
  return infos;
}

void expect_consistent(const std::vector<RendezvousInfo>& infos, const std::vector<int>& nprocs) {
  int world = 0;
  for (int n : nprocs) world += n;
  std::set<int> ranks, groups;
  for (size_t i = 0; i < infos.size(); ++i) {
    EXPECT_EQ(infos[i].world_size, world);
    EXPECT_EQ(infos[i].group_world_size, static_cast<int>(infos.size()));
    EXPECT_EQ(infos[i].master_addr, infos[0].master_addr);
    EXPECT_EQ(infos[i].master_port, infos[0].master_port);
    EXPECT_GT(infos[i].master_port, 0);
    EXPECT_EQ(infos[i].store_secret, infos[0].store_secret);
    groups.insert(infos[i].group_rank);
    for (int l = 0; l < infos[i].local_world_size; ++l) {
      EXPECT_TRUE(ranks.insert(infos[i].rank_offset + l).second) << "duplicate rank";
    }
  }
  EXPECT_EQ(static_cast<int>(ranks.size()), world);
  EXPECT_EQ(*ranks.rbegin(), world - 1);
  EXPECT_EQ(static_cast<int>(groups.size()), static_cast<int>(infos.size()));
  EXPECT_EQ(infos[0].store_secret.size(), 64u);
}

TEST(StoreRendezvous, DynamicRanksAreContiguousForUnevenNodes) {
  for (int nodes : {1, 2, 3, 4}) {
    auto store = std::make_shared<HashStore>();
    std::vector<LaunchConfig> configs;
    std::vector<int> nprocs;
    for (int i = 0; i < nodes; ++i) {
      nprocs.push_back(1 + i % 3);
      configs.push_back(node_config(nodes, nodes, nprocs.back(), "c10d"));
    }
    std::vector<std::unique_ptr<StoreRendezvous>> rdzv;
    auto infos = join_all(configs, &rdzv, store);
    EXPECT_EQ(infos[0].group_rank, 0);  // the host is group rank 0
    expect_consistent(infos, nprocs);
  }
}

TEST(StoreRendezvous, StaticUsesNodeRank) {
  auto store = std::make_shared<HashStore>();
  // Node 0 hosts; configs[1] is node rank 2, configs[2] node rank 1.
  std::vector<LaunchConfig> configs = {node_config(3, 3, 2, "static", 0),
                                       node_config(3, 3, 1, "static", 2),
                                       node_config(3, 3, 3, "static", 1)};
  std::vector<std::unique_ptr<StoreRendezvous>> rdzv;
  auto infos = join_all(configs, &rdzv, store);
  EXPECT_EQ(infos[1].group_rank, 2);
  EXPECT_EQ(infos[1].rank_offset, 2 + 3);
  EXPECT_EQ(infos[2].group_rank, 1);
  EXPECT_EQ(infos[2].rank_offset, 2);
  expect_consistent(infos, {2, 1, 3});
}

TEST(StoreRendezvous, DuplicateStaticNodeRankIsNamed) {
  auto store = std::make_shared<HashStore>();
  StoreRendezvous first(store, node_config(2, 2, 1, "static", 1), false);
  StoreRendezvous second(store, node_config(2, 2, 1, "static", 1), false);
  std::thread t([&] {
    try {
      first.join(0, 0);
    } catch (...) {
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  try {
    second.join(0, 0);
    ADD_FAILURE() << "expected a duplicate node rank error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("node rank 1 joined twice"), std::string::npos)
        << e.what();
  }
  first.abort("test over");  // releases the first node's wait
  t.join();
}

TEST(StoreRendezvous, FailureOnOneNodeIsSeenByAllAndNextRoundWorks) {
  auto store = std::make_shared<HashStore>();
  std::vector<LaunchConfig> configs = {node_config(2, 2, 1, "c10d"), node_config(2, 2, 2, "c10d")};
  std::vector<std::unique_ptr<StoreRendezvous>> rdzv;
  auto round0 = join_all(configs, &rdzv, store, 0);
  EXPECT_FALSE(rdzv[0]->failure_reported(0));
  rdzv[1]->report_failure(0, "rank 2 exited with code 3");
  rdzv[0]->report_failure(0, "rank 0 was stopped");  // later reports do not replace it
  EXPECT_TRUE(rdzv[0]->failure_reported(0));
  EXPECT_EQ(rdzv[0]->failure(0), "rank 2 exited with code 3");
  auto round1 = join_all(configs, &rdzv, store, 1);
  EXPECT_EQ(round1[0].round, 1);
  EXPECT_FALSE(rdzv[0]->failure_reported(1));
  expect_consistent(round1, {1, 2});
  EXPECT_NE(round1[0].master_port, 0);
  rdzv[0]->report_success(1);
  EXPECT_FALSE(rdzv[1]->all_succeeded(1));
  rdzv[1]->report_success(1);
  EXPECT_TRUE(rdzv[0]->all_succeeded(1));
  EXPECT_TRUE(rdzv[1]->all_succeeded(1));
}

TEST(StoreRendezvous, ElasticClosesAfterLastCallWithMinNodes) {
  auto store = std::make_shared<HashStore>();
  // MIN 2, MAX 4, but only 3 nodes come: closes with 3 after the last call.
  std::vector<LaunchConfig> configs(3, node_config(2, 4, 1, "c10d"));
  std::vector<std::unique_ptr<StoreRendezvous>> rdzv;
  auto infos = join_all(configs, &rdzv, store);
  expect_consistent(infos, {1, 1, 1});
}

TEST(StoreRendezvous, MissingNodeTimesOutNamingTheWait) {
  auto store = std::make_shared<HashStore>();
  auto config = node_config(2, 2, 1, "c10d");
  config.join_timeout = std::chrono::milliseconds(300);
  StoreRendezvous host(store, config, true);
  try {
    host.join(0, 0);
    ADD_FAILURE() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("2 nodes to join round 0"), std::string::npos) << e.what();
  }
}

TEST(StoreRendezvous, InterruptStopsTheWait) {
  auto store = std::make_shared<HashStore>();
  StoreRendezvous host(store, node_config(2, 2, 1, "c10d"), true);
  host.set_interrupt_check([] { return true; });
  EXPECT_THROW(host.join(0, 0), Interrupted);
}

// Note [Late joiners]: a node that comes after an elastic round closed waits, is counted as
// waiting, and joins the next round when the running nodes end theirs for it.
TEST(StoreRendezvous, LateNodeWaitsAndJoinsTheNextRound) {
  auto store = std::make_shared<HashStore>();
  std::vector<LaunchConfig> configs(2, node_config(1, 3, 1, "c10d"));
  std::vector<std::unique_ptr<StoreRendezvous>> rdzv;
  auto round0 = join_all(configs, &rdzv, store, 0);
  expect_consistent(round0, {1, 1});
  EXPECT_EQ(rdzv[0]->nodes_waiting(0), 0);

  StoreRendezvous late(store, node_config(1, 3, 2, "c10d"), false);
  RendezvousInfo late_info;
  std::string late_error;
  std::thread t([&] {
    try {
      late_info = late.join(0, 0);
    } catch (const std::exception& e) {
      late_error = e.what();
    }
  });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (rdzv[1]->nodes_waiting(0) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(rdzv[1]->nodes_waiting(0), 1);
  rdzv[1]->request_rejoin(0, "a node is waiting to join");
  rdzv[0]->report_failure(0, "rank 0 was stopped");  // too late: the round already ended
  EXPECT_TRUE(rdzv[0]->failure_reported(0));
  EXPECT_TRUE(rdzv[0]->membership_changed(0));
  auto round1 = join_all(configs, &rdzv, store, 1);
  t.join();
  ASSERT_EQ(late_error, "");
  round1.push_back(late_info);
  expect_consistent(round1, {1, 1, 2});
  for (const auto& info : round1) {
    EXPECT_EQ(info.round, 1);
    EXPECT_EQ(info.restart_count, 0) << "a membership change is not a restart";
  }
  EXPECT_EQ(late_info.group_rank, 2);
}

TEST(StoreRendezvous, FailureRestartsArePublishedByNodeZero) {
  auto store = std::make_shared<HashStore>();
  std::vector<LaunchConfig> configs(2, node_config(2, 2, 1, "c10d"));
  std::vector<std::unique_ptr<StoreRendezvous>> rdzv;
  join_all(configs, &rdzv, store, 0);
  std::vector<RendezvousInfo> infos(2);
  std::thread client([&] { infos[1] = rdzv[1]->join(1, 0); });  // its own count is behind
  infos[0] = rdzv[0]->join(1, 1);
  client.join();
  EXPECT_EQ(infos[0].restart_count, 1);
  EXPECT_EQ(infos[1].restart_count, 1);
}

TEST(StoreRendezvous, FullRoundRefusesALateNode) {
  auto store = std::make_shared<HashStore>();
  std::vector<LaunchConfig> configs(2, node_config(1, 2, 1, "c10d"));
  std::vector<std::unique_ptr<StoreRendezvous>> rdzv;
  join_all(configs, &rdzv, store, 0);
  StoreRendezvous late(store, node_config(1, 2, 1, "c10d"), false);
  try {
    late.join(0, 0);
    ADD_FAILURE() << "a third node joined a 1:2 job";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the rendezvous is full: 2 nodes"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(rdzv[0]->nodes_waiting(0), 0);
}

TEST(StoreRendezvous, LateNodeStopsWaitingWhenTheJobIsOver) {
  auto store = std::make_shared<HashStore>();
  std::vector<LaunchConfig> configs(1, node_config(1, 2, 1, "c10d"));
  std::vector<std::unique_ptr<StoreRendezvous>> rdzv;
  join_all(configs, &rdzv, store, 0);
  rdzv[0]->report_success(0);
  StoreRendezvous late(store, node_config(1, 2, 1, "c10d"), false);
  try {
    late.join(0, 0);
    ADD_FAILURE() << "joined a finished job";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the job finished (round 0 succeeded on its 1 node(s)) "
                                         "before this node could join"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tdist::launch

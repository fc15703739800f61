// init_process_group through every init method, end to end, with the collectives of
// distributed.h checked against computed expectations at world sizes 1-4.
#include <cmath>
#include <cstdlib>

#include <torch/torch.h>

#include "comm/comm_test_util.h"
#include "tdist/detail/util/openblas_core.h"
#include "tdist/store/tcp_store.h"

namespace tdist {
namespace {

using namespace tdist::testing;

/// Runs every collective once on `group` (null: world) and checks the results.
void check_collectives(const ProcessGroupPtr& group) {
  const int rank = get_rank(group);
  const int n = get_world_size(group);
  const int last = get_global_rank(group ? group : group_world(), n - 1);

  at::Tensor t = torch::full({3}, rank + 1.0);
  all_reduce(t, ReduceOp::SUM, group);
  EXPECT_TRUE(t.equal(torch::full({3}, n * (n + 1) / 2.0))) << t;

  at::Tensor mx = torch::tensor({rank, -rank}, torch::kInt64);
  all_reduce(mx, ReduceOp::MAX, group, /*async_op=*/true)->wait();
  EXPECT_TRUE(mx.equal(torch::tensor({n - 1, 0}, torch::kInt64))) << mx;

  at::Tensor b = torch::full({2, 2}, static_cast<float>(rank));
  broadcast(b, last, group);
  EXPECT_TRUE(b.equal(torch::full({2, 2}, static_cast<float>(n - 1))));

  std::vector<at::Tensor> list;
  for (int r = 0; r < n; ++r) list.push_back(torch::empty({2}, torch::kInt32));
  all_gather(list, torch::full({2}, rank * 10, torch::kInt32), group);
  for (int r = 0; r < n; ++r) EXPECT_EQ(list[r][1].item<int>(), r * 10);

  at::Tensor gathered = torch::empty({n * 2});
  all_gather_into_tensor(gathered, torch::full({2}, static_cast<float>(rank)), group);
  EXPECT_EQ(gathered[2 * (n - 1)].item<float>(), n - 1);

  at::Tensor rs = torch::empty({2});
  reduce_scatter_tensor(rs, torch::arange(2 * n, torch::kFloat32), ReduceOp::SUM, group);
  EXPECT_TRUE(rs.equal(torch::arange(2 * rank, 2 * rank + 2, torch::kFloat32) * n)) << rs;

  at::Tensor red = torch::full({1}, 2.0);
  reduce(red, last, ReduceOp::PRODUCT, group);
  if (rank == n - 1) {
    EXPECT_EQ(red.item<float>(), std::pow(2.0f, n));
  }

  // gather to the last rank, scatter from it.
  std::vector<at::Tensor> glist;
  if (rank == n - 1) {
    for (int r = 0; r < n; ++r) glist.push_back(torch::empty({1}));
  }
  gather(torch::full({1}, static_cast<float>(rank)), glist, last, group);
  for (int r = 0; rank == n - 1 && r < n; ++r) EXPECT_EQ(glist[r].item<float>(), r);
  std::vector<at::Tensor> slist;
  if (rank == n - 1) {
    for (int r = 0; r < n; ++r) slist.push_back(torch::full({1}, r * 3.0));
  }
  at::Tensor s = torch::empty({1});
  scatter(s, slist, last, group);
  EXPECT_EQ(s.item<float>(), rank * 3.0);

  // Uneven all_to_all_single: rank r sends (r+1) rows to every peer.
  at::Tensor in = torch::full({(rank + 1) * n}, static_cast<float>(rank));
  std::vector<int64_t> in_splits(n, rank + 1), out_splits;
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    out_splits.push_back(r + 1);
    total += r + 1;
  }
  at::Tensor out = torch::empty({total});
  all_to_all_single(out, in, out_splits, in_splits, group);
  int64_t offset = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(out.narrow(0, offset, r + 1).eq(r).all().item<bool>()) << out;
    offset += r + 1;
  }

  barrier(group);
  monitored_barrier(group, std::chrono::seconds(20));

  if (n > 1) {  // ring of isend/irecv with a tag
    const int next = get_global_rank(group ? group : group_world(), (rank + 1) % n);
    const int prev = get_global_rank(group ? group : group_world(), (rank + n - 1) % n);
    at::Tensor got = torch::empty({2});
    auto rw = irecv(got, prev, group, 7);
    auto sw = isend(torch::full({2}, static_cast<float>(rank)), next, group, 7);
    sw->wait();
    rw->wait();
    EXPECT_EQ(got[0].item<float>(), (rank + n - 1) % n);
  }
}

TDIST_SCENARIO(comm_env_init) {
  init_process_group(test_init_options());
  EXPECT_TRUE(is_initialized());
  EXPECT_EQ(get_rank(), env_int("RANK", -1));
  EXPECT_EQ(get_world_size(), env_int("WORLD_SIZE", -1));
  EXPECT_EQ(get_backend(), test_backend());
  check_collectives(nullptr);
  destroy_process_group();
  EXPECT_FALSE(is_initialized());
}

TEST(InitEnv, CollectivesAtWorldSizes1To4) {
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("world size " + std::to_string(n));
    expect_all_ok(run_ranks_as_processes("comm_env_init", n, short_run()));
  }
}

// Note [OpenBLAS on CPUs it does not know]: a process whose OpenBLAS fell back to its
// generic kernels on a CPU with better ones is told, once, which OPENBLAS_CORETYPE to set;
// one that set it (or needs nothing) is not. The ranks load the same OpenBLAS as this test
// binary, so its own choice says what they will see.
TEST(InitEnv, WarnsOnceWhenOpenBlasRunsItsGenericKernels) {
  const bool user_set = std::getenv("OPENBLAS_CORETYPE") != nullptr;
  const char* fix = detail::openblas_coretype_fix(detail::loaded_openblas_core());
  const std::string warning = "OpenBLAS does not recognise this CPU";
  auto count = [&](const std::string& output) {
    size_t n = 0;
    for (size_t at = output.find(warning); at != std::string::npos;
         at = output.find(warning, at + 1)) {
      ++n;
    }
    return n;
  };
  auto results = run_ranks_as_processes("comm_env_init", 2, short_run());
  expect_all_ok(results);
  for (const auto& r : results) {
    EXPECT_EQ(count(r.output), fix && !user_set ? 1u : 0u) << r.output;
    if (fix && !user_set) {
      EXPECT_NE(r.output.find(std::string("OPENBLAS_CORETYPE=") + fix), std::string::npos);
    }
  }
  auto opts = short_run();
  opts.env["OPENBLAS_CORETYPE"] = "Haswell";
  results = run_ranks_as_processes("comm_env_init", 2, opts);
  expect_all_ok(results);
  for (const auto& r : results) EXPECT_EQ(count(r.output), 0u) << r.output;
}

TDIST_SCENARIO(comm_tcp_init) {
  const int rank = env_int("RANK", -1), n = env_int("WORLD_SIZE", -1);
  init_process_group(test_init_options()
                         .init_method("tcp://127.0.0.1:" + std::to_string(env_int("COMM_PORT", 0)))
                         .rank(rank)
                         .world_size(n));
  EXPECT_EQ(get_rank(), rank);
  check_collectives(nullptr);
  destroy_process_group();
}

TEST(InitTcp, ExplicitRankAndWorldSize) {
  for (int n : {2, 3}) {
    auto opts = short_run();
    opts.env["COMM_PORT"] = std::to_string(free_port());
    expect_all_ok(run_ranks_as_processes("comm_tcp_init", n, opts));
  }
}

TDIST_SCENARIO(comm_file_init) {
  const int rank = env_int("RANK", -1), n = env_int("WORLD_SIZE", -1);
  // Rank and world size come from the URL only.
  init_process_group(test_init_options().init_method(
      "file://" + std::string(std::getenv("COMM_FILE")) + "?rank=" + std::to_string(rank) +
      "&world_size=" + std::to_string(n)));
  EXPECT_EQ(get_world_size(), n);
  check_collectives(nullptr);
  destroy_process_group();
}

TEST(InitFile, RankAndWorldSizeInUrl) {
  for (int n : {1, 2, 4}) {
    auto opts = short_run();
    opts.env["COMM_FILE"] = make_temp_dir("comm-file") + "/rendezvous";
    expect_all_ok(run_ranks_as_processes("comm_file_init", n, opts));
  }
}

TDIST_SCENARIO(comm_store_init) {
  const int rank = env_int("RANK", -1), n = env_int("WORLD_SIZE", -1);
  auto store = std::make_shared<TCPStore>("127.0.0.1", TCPStoreOptions()
                                                           .port(env_int("MASTER_PORT", 0))
                                                           .is_server(rank == 0)
                                                           .num_workers(n)
                                                           .timeout(std::chrono::seconds(30)));
  init_process_group(
      test_init_options().store(store).rank(rank).world_size(n).group_name("ignored"));
  check_collectives(nullptr);
  destroy_process_group();
}

TEST(InitStore, ExplicitStore) {
  expect_all_ok(run_ranks_as_processes("comm_store_init", 3, short_run()));
}

TDIST_SCENARIO(comm_env_args_init) {
  // RANK and WORLD_SIZE are absent from the environment; the call supplies them.
  init_process_group(test_init_options().rank(env_int("COMM_RANK", -1)).world_size(2));
  EXPECT_EQ(get_rank(), env_int("COMM_RANK", -1));
  check_collectives(nullptr);
  destroy_process_group();
}

TEST(InitEnv, RankAndWorldSizeFromArguments) {
  auto opts = short_run();
  opts.bare_env = true;
  opts.env["MASTER_ADDR"] = "127.0.0.1";
  opts.env["MASTER_PORT"] = std::to_string(free_port());
  opts.rank_env[0]["COMM_RANK"] = "0";
  opts.rank_env[1]["COMM_RANK"] = "1";
  expect_all_ok(run_ranks_as_processes("comm_env_args_init", 2, opts));
}

TDIST_SCENARIO(comm_reinit) {
  for (int round = 0; round < 2; ++round) {
    // A fresh port per round: the first round's store may outlive destroy briefly on rank 0.
    const int port = env_int(round == 0 ? "COMM_PORT" : "COMM_PORT2", 0);
    init_process_group(test_init_options()
                           .init_method("tcp://127.0.0.1:" + std::to_string(port))
                           .rank(env_int("RANK", -1))
                           .world_size(env_int("WORLD_SIZE", -1)));
    at::Tensor t = torch::ones({1});
    all_reduce(t);
    EXPECT_EQ(t.item<float>(), get_world_size());
    destroy_process_group();
  }
}

TEST(InitEnv, DestroyThenInitAgain) {
  auto opts = short_run();
  opts.env["COMM_PORT"] = std::to_string(free_port());
  opts.env["COMM_PORT2"] = std::to_string(free_port());
  expect_all_ok(run_ranks_as_processes("comm_reinit", 2, opts));
}

}  // namespace
}  // namespace tdist

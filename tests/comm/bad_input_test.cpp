// Bad input: each case raises a clear error naming the problem, never hangs or aborts.
// Errors found before the rendezvous are checked in-process; launch errors with processes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>

#include <torch/torch.h>

#include "comm/comm_test_util.h"
#include "support/expect.h"
#include "tdist/error.h"
#include "tdist/store/file_store.h"
#include "tdist/store/hash_store.h"

namespace tdist {
namespace {

using namespace tdist::testing;

/// Sets (or, with nullptr, unsets) environment variables for one test, restoring them after.
class EnvGuard {
 public:
  EnvGuard(std::map<std::string, const char*> values) {
    for (const auto& [name, value] : values) {
      const char* old = std::getenv(name.c_str());
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value) {
        ::setenv(name.c_str(), value, 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  ~EnvGuard() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

using tdist::testing::error_of;

#define EXPECT_ERROR_CONTAINS(expr, fragment)                                     \
  do {                                                                            \
    std::string what_ = error_of([&] { expr; });                                  \
    EXPECT_NE(what_.find(fragment), std::string::npos) << "error was: " << what_; \
  } while (0)

InitProcessGroupOptions fast() {
  return test_init_options().timeout(std::chrono::milliseconds(1500));
}

const std::map<std::string, const char*> kFullEnv{
    {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}};

TEST(BadInput, MissingEnvVarsAreNamed) {
  for (const char* missing : {"MASTER_PORT", "RANK", "WORLD_SIZE"}) {
    auto env = kFullEnv;
    env[missing] = nullptr;
    EnvGuard guard(env);
    EXPECT_ERROR_CONTAINS(init_process_group(fast()), std::string(missing) +
                                                          " is not set: env:// "
                                                          "needs MASTER_ADDR, MASTER_PORT, RANK, "
                                                          "WORLD_SIZE");
    EXPECT_FALSE(is_initialized());
  }
  // MASTER_ADDR is required of rank 0 too, not only of the ranks that connect to it.
  for (const char* rank : {"0", "1"}) {
    EnvGuard guard(
        {{"MASTER_ADDR", nullptr}, {"MASTER_PORT", "1"}, {"RANK", rank}, {"WORLD_SIZE", "2"}});
    EXPECT_ERROR_CONTAINS(init_process_group(fast()),
                          "MASTER_ADDR is not set on rank " + std::string(rank) +
                              " (every rank needs rank 0's address, rank 0 included): "
                              "env:// needs MASTER_ADDR");
    EXPECT_FALSE(is_initialized());
  }
}

TEST(BadInput, MalformedAndNegativeEnvValuesAreNamed) {
  auto env = kFullEnv;
  env["WORLD_SIZE"] = "four";
  {
    EnvGuard guard(env);
    EXPECT_ERROR_CONTAINS(init_process_group(fast()), "WORLD_SIZE='four' is not an integer");
  }
  env = kFullEnv;
  env["RANK"] = "-2";
  {
    EnvGuard guard(env);
    EXPECT_ERROR_CONTAINS(init_process_group(fast()), "RANK=-2 is out of range");
  }
  env = kFullEnv;
  env["MASTER_PORT"] = "70000";
  {
    EnvGuard guard(env);
    EXPECT_ERROR_CONTAINS(init_process_group(fast()), "MASTER_PORT=70000 is out of range");
  }
  env = kFullEnv;
  env["RANK"] = "3";
  env["WORLD_SIZE"] = "2";
  {
    EnvGuard guard(env);
    EXPECT_ERROR_CONTAINS(init_process_group(fast()), "RANK=3 is not below WORLD_SIZE=2");
  }
}

TEST(BadInput, BadArguments) {
  auto store = std::make_shared<HashStore>();
  EXPECT_ERROR_CONTAINS(init_process_group(fast().store(store).rank(2).world_size(2)),
                        "rank 2 is not below world_size 2");
  EXPECT_ERROR_CONTAINS(init_process_group(fast().store(store).rank(-3).world_size(2)),
                        "rank=-3 is negative");
  EXPECT_ERROR_CONTAINS(init_process_group(fast().store(store).rank(0).world_size(-5)),
                        "world_size=-5 must be positive");
  EXPECT_ERROR_CONTAINS(init_process_group(fast().store(store)),
                        "rank and world_size must be given");
  EXPECT_ERROR_CONTAINS(
      init_process_group(fast().store(store).init_method("env://").rank(0).world_size(1)),
      "either init_method or store");
  EXPECT_ERROR_CONTAINS(init_process_group(fast().init_method("tcp://127.0.0.1:1")),
                        "needs rank and world_size");
  EXPECT_ERROR_CONTAINS(init_process_group(fast().backend("glo")), "unknown backend 'glo'");
  EXPECT_ERROR_CONTAINS(init_process_group(fast().backend("nccl")), "no CUDA");
  EXPECT_ERROR_CONTAINS(init_process_group(fast().backend("cpu:gloo,cuda:nccl")), "no CUDA");
  EXPECT_ERROR_CONTAINS(init_process_group(fast().timeout(std::chrono::milliseconds(-1))),
                        "timeout must not be negative");
  EXPECT_FALSE(is_initialized());
}

TEST(BadInput, CollectiveBeforeInit) {
  EXPECT_ERROR_CONTAINS(all_reduce(torch::ones({1})),
                        "all_reduce called before init_process_group");
  EXPECT_ERROR_CONTAINS(barrier(), "barrier called before init_process_group");
  EXPECT_ERROR_CONTAINS(new_group({0}), "new_group called before init_process_group");
}

/// World of one in this process, over an in-memory store.
class WorldOfOne : public ::testing::Test {
 protected:
  void SetUp() override {
    init_process_group(fast().store(std::make_shared<HashStore>()).rank(0).world_size(1));
  }
  void TearDown() override {
    if (is_initialized()) destroy_process_group();
  }
};

TEST_F(WorldOfOne, InitTwiceIsRejected) {
  EXPECT_ERROR_CONTAINS(
      init_process_group(fast().store(std::make_shared<HashStore>()).rank(0).world_size(1)),
      "init_process_group called twice");
  EXPECT_TRUE(is_initialized());
}

TEST_F(WorldOfOne, NonContiguousOutputRejectedInputHandled) {
  at::Tensor t = torch::arange(6, torch::kFloat32).view({2, 3}).t();
  EXPECT_ERROR_CONTAINS(all_reduce(t), "tensor is not contiguous");
  std::vector<at::Tensor> out{torch::empty({3, 2})};
  all_gather(out, t);  // a read-only input is made contiguous
  EXPECT_TRUE(out[0].equal(t));
}

TEST_F(WorldOfOne, LocallyDetectableSizeAndDtypeMismatches) {
  EXPECT_ERROR_CONTAINS(all_gather_into_tensor(torch::empty({3}), torch::ones({2})),
                        "output_tensor has 3 elements but must have world size (1) x input (2)");
  std::vector<at::Tensor> two{torch::empty({2}), torch::empty({2})};
  EXPECT_ERROR_CONTAINS(all_gather(two, torch::ones({2})), "tensor_list has 2 tensors");
  std::vector<at::Tensor> wrong_dtype{torch::empty({2}, torch::kInt64)};
  EXPECT_ERROR_CONTAINS(all_gather(wrong_dtype, torch::ones({2})), "has dtype Long");
  EXPECT_ERROR_CONTAINS(all_to_all_single(torch::empty({4}), torch::ones({4}), {3}, {4}),
                        "output_split_sizes sum to 3");
  EXPECT_ERROR_CONTAINS(broadcast(torch::ones({1}), 1), "src global rank 1 is not a member");
  EXPECT_ERROR_CONTAINS(all_reduce(at::Tensor()), "tensor is undefined");
  EXPECT_ERROR_CONTAINS(send(torch::ones({1}), 0), "is this rank itself");
}

TEST_F(WorldOfOne, MonitoredBarrierAndObjectsAlone) {
  monitored_barrier();
  at::Tensor t = torch::full({2}, 3.0);
  all_reduce(t, ReduceOp::AVG);
  EXPECT_EQ(t[0].item<float>(), 3.0f);
}

TEST(BadInput, UnreachableMasterNamesHostPortWithinTimeout) {
  const int port = free_port();  // nobody listens there
  EnvGuard guard({{"MASTER_ADDR", "127.0.0.1"},
                  {"MASTER_PORT", std::to_string(port).c_str()},
                  {"RANK", "1"},
                  {"WORLD_SIZE", "2"}});
  EXPECT_ERROR_CONTAINS(init_process_group(fast()), "127.0.0.1:" + std::to_string(port));
  EXPECT_FALSE(is_initialized());
}

size_t count_of(const std::string& text, const std::string& fragment) {
  size_t n = 0;
  for (size_t at = text.find(fragment); at != std::string::npos; at = text.find(fragment, at + 1))
    ++n;
  return n;
}

TEST(BadInput, RankWaitingForItsMasterSaysOnceWhatItWaitsFor) {
  const int port = free_port();  // nobody listens there
  const std::string where = "127.0.0.1:" + std::to_string(port);
  EnvGuard guard({{"MASTER_ADDR", "127.0.0.1"},
                  {"MASTER_PORT", std::to_string(port).c_str()},
                  {"RANK", "1"},
                  {"WORLD_SIZE", "2"}});
  ::testing::internal::CaptureStderr();
  // Past the notice's 5 s, so the notice must appear before the error.
  const std::string error =
      error_of([&] { init_process_group(test_init_options().timeout(std::chrono::seconds(7))); });
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(said, "waiting for the store"), 1u) << said;
  EXPECT_NE(said.find("rank 1: waiting for the store at " + where +
                      " (rank 0 hosts it); 5 s so far, "
                      "timeout 7 s"),
            std::string::npos)
      << said;
  EXPECT_NE(error.find(where), std::string::npos) << error;
  EXPECT_NE(error.find("within 7 s"), std::string::npos) << error;
  EXPECT_FALSE(is_initialized());
}

TEST(BadInput, PortInUseIsNamed) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  {
    EnvGuard guard({{"MASTER_ADDR", "127.0.0.1"},
                    {"MASTER_PORT", port.c_str()},
                    {"RANK", "0"},
                    {"WORLD_SIZE", "1"}});
    EXPECT_ERROR_CONTAINS(init_process_group(fast()), "127.0.0.1:" + port);
  }
  ::close(fd);
  EXPECT_FALSE(is_initialized());
}

TEST(BadInput, StaleFileIsReportedNotWaitedOn) {
  const std::string path = make_temp_dir("comm-stale") + "/rendezvous";
  // An earlier job of two crashed after both workers joined: its file stays behind. The
  // stores are leaked on purpose (a crashed process never runs their destructors).
  new FileStore(path, 2, std::chrono::seconds(1));
  new FileStore(path, 2, std::chrono::seconds(1));
  std::string what = error_of(
      [&] { init_process_group(fast().init_method("file://" + path + "?rank=0&world_size=2")); });
  EXPECT_NE(what.find(path), std::string::npos) << what;
  EXPECT_NE(what.find("stale"), std::string::npos) << what;
  EXPECT_FALSE(is_initialized());
}

// ---- bad launches, with real processes ---------------------------------

TDIST_SCENARIO(comm_init_only) {
  // Generous for a loaded CI machine: process start-up alone can take seconds.
  init_process_group(test_init_options().timeout(std::chrono::seconds(8)));
  destroy_process_group();
}

TEST(BadLaunch, WorldSizeLargerThanStartedNamesExpectedAndJoined) {
  auto opts = short_run();
  opts.env["WORLD_SIZE"] = "3";  // only two are started
  auto results = run_ranks_as_processes("comm_init_only", 2, opts);
  expect_failed_with(results,
                     "expected WORLD_SIZE=3 processes but only 2 joined (missing ranks: 2)");
}

TEST(BadLaunch, DuplicateRankIsNamed) {
  auto opts = short_run();
  opts.rank_env[2]["RANK"] = "1";  // ranks 1 and 2 both claim RANK=1
  auto results = run_ranks_as_processes("comm_init_only", 3, opts);
  expect_failed_with(results, "RANK 1 was claimed by two processes");
}

TEST(BadLaunch, WorldSizeMismatchIsNamed) {
  auto opts = short_run();
  opts.rank_env[2]["WORLD_SIZE"] = "4";
  auto results = run_ranks_as_processes("comm_init_only", 3, opts);
  expect_failed_with(results,
                     "WORLD_SIZE mismatch: rank 2 has world_size=4 but rank 0 has "
                     "world_size=3");
}

TDIST_SCENARIO(comm_monitored_barrier_missing) {
  init_process_group(test_init_options());
  const int rank = get_rank(), n = get_world_size();
  const bool wait_all = std::getenv("COMM_WAIT_ALL") != nullptr;
  // The last rank (and with wait_all, the last two) never arrive.
  const bool absent = rank == n - 1 || (wait_all && rank == n - 2);
  std::string error;
  if (!absent) {
    try {
      monitored_barrier(nullptr, std::chrono::milliseconds(1500), wait_all);
    } catch (const TimeoutError& e) {
      error = e.what();
      std::cout << "caught: " << error << std::endl;
    }
    EXPECT_FALSE(error.empty()) << "rank " << rank
                                << ": monitored_barrier passed with a rank missing";
  }
  destroy_process_group();
}

TEST(MonitoredBarrier, NamesTheRanksThatDidNotArrive) {
  auto results = run_ranks_as_processes("comm_monitored_barrier_missing", 3, short_run());
  expect_all_ok(results);
  for (int r : {0, 1}) {
    EXPECT_NE(results[r].output.find("rank 2 did not arrive"), std::string::npos)
        << results[r].output;
  }
  auto opts = short_run();
  opts.env["COMM_WAIT_ALL"] = "1";
  results = run_ranks_as_processes("comm_monitored_barrier_missing", 4, opts);
  expect_all_ok(results);
  for (int r : {0, 1}) {
    EXPECT_NE(results[r].output.find("ranks 2, 3 did not arrive"), std::string::npos)
        << results[r].output;
  }
}

}  // namespace
}  // namespace tdist

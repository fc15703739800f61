// Dead and frozen peers, with ranks as real processes over a FileStore: a SIGKILLed rank
// makes the others raise NetworkError naming it within 2 s; a SIGSTOPped rank makes the
// others raise TimeoutError within timeout + 1 s naming op, sequence number and peer; both
// leave the group broken so that the next collective fails at once.

#include <signal.h>
#include <unistd.h>

#include <thread>

#include "comm_gloo/gloo_test_util.h"
#include "tdist/comm/symmetric_memory.h"
#include "tdist/error.h"
#include "tdist/store/file_store.h"
#include "tdist/store/tcp_store.h"

namespace tdist::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

StorePtr scenario_store() {
  const char* path = std::getenv("TDIST_GLOO_TEST_STORE");
  if (!path) throw std::runtime_error("TDIST_GLOO_TEST_STORE not set");
  return std::make_shared<FileStore>(path, -1, std::chrono::seconds(20));
}

void expect_refuses_at_once(GlooBackend& b) {
  at::Tensor t = torch::ones({4});
  auto start = Clock::now();
  EXPECT_THROW(b.all_reduce(t, {})->wait(), DistBackendError);
  EXPECT_LT(Clock::now() - start, 500ms);
  EXPECT_TRUE(b.is_broken());
}

// Rank `victim` SIGKILLs itself while its all_reduce of `big` is in flight; every other rank
// must raise NetworkError naming it within `within`, and the group then refuses at once.
void victim_dies_mid_all_reduce(GlooBackend& b, int rank, int victim, at::Tensor big,
                                std::chrono::seconds within) {
  if (rank == victim) {
    auto work = b.all_reduce(big, {});
    std::this_thread::sleep_for(5ms);
    ::raise(SIGKILL);
  }
  auto start = Clock::now();
  try {
    b.all_reduce(big, {})->wait();
    ADD_FAILURE() << "all_reduce survived a dead peer";
  } catch (const NetworkError& e) {
    const std::string msg = e.what();
    std::cerr << "rank " << rank << " got: " << msg << "\n";
    EXPECT_LT(Clock::now() - start, within);
    EXPECT_NE(msg.find("rank " + std::to_string(victim)), std::string::npos) << msg;
  }
  expect_refuses_at_once(b);
}

TDIST_SCENARIO(gloo_sigkill_mid_all_reduce) {
  const int rank = env_int("RANK", -1), world = env_int("WORLD_SIZE", -1);
  const int victim = env_int("VICTIM", 1);
  GlooBackend b(scenario_store(), rank, world, 20s);
  for (int i = 0; i < 2; ++i) {
    at::Tensor t = torch::ones({1000});
    b.all_reduce(t, {})->wait();
  }
  // SYMMETRIC=1: the tensor lives in symmetric memory, so after the handshake the survivors
  // wait on the victim's shared-memory flags, not on TCP (Note [Flag notifications]); 64 MiB
  // keeps the victim inside the collective when it dies.
  const bool symmetric = env_int("SYMMETRIC", 0) == 1;
  at::Tensor big =
      symmetric ? tdist::symmetric_memory::empty({16 << 20}).fill_(1) : torch::ones({4 << 20});
  victim_dies_mid_all_reduce(b, rank, victim, big, 2s);
}

// The rank that hosts the group's TCPStore dies mid-collective: the survivors must still
// fail at once (Note [Best-effort store calls]), not after the store client's reconnect
// timeout (60 s here).
TDIST_SCENARIO(gloo_store_host_killed) {
  const int rank = env_int("RANK", -1), world = env_int("WORLD_SIZE", -1);
  auto store = std::make_shared<TCPStore>("127.0.0.1", TCPStoreOptions()
                                                           .port(env_int("MASTER_PORT", -1))
                                                           .is_server(rank == 0)
                                                           .num_workers(world)
                                                           .timeout(60s));
  GlooBackend b(store, rank, world, 20s);
  at::Tensor t = torch::ones({1000});
  b.all_reduce(t, {})->wait();
  victim_dies_mid_all_reduce(b, rank, /*victim=*/0, torch::ones({4 << 20}), 15s);
}

TDIST_SCENARIO(gloo_sigstop_times_out) {
  const int rank = env_int("RANK", -1), world = env_int("WORLD_SIZE", -1);
  const int victim = world - 1;
  auto store = scenario_store();
  GlooBackend b(store, rank, world, 20s);
  at::Tensor t = torch::ones({1000});
  b.all_reduce(t, {})->wait();
  if (rank == victim) {
    store->set("victim_pid", std::to_string(::getpid()));
    ::raise(SIGSTOP);
    std::this_thread::sleep_for(60s);  // never reached: rank 0 kills us
  }
  store->wait({"victim_pid"});
  AllreduceOptions opts;
  opts.timeout = 1000ms;
  auto start = Clock::now();
  try {
    b.all_reduce(t, opts)->wait();
    ADD_FAILURE() << "all_reduce survived a frozen peer";
  } catch (const TimeoutError& e) {
    const std::string msg = e.what();
    std::cerr << "rank " << rank << " got: " << msg << "\n";
    auto took = Clock::now() - start;
    // The op's 1 s timeout, not the backend's 20 s (generous: CI machines are loaded).
    EXPECT_GE(took, 990ms);
    EXPECT_LT(took, 10s);
    EXPECT_NE(msg.find("all_reduce #2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(victim)), std::string::npos) << msg;
  } catch (const NetworkError& e) {
    // A rank that was not waiting on the victim sees the first rank's abort instead; it
    // must still name the frozen rank through the recorded first failure.
    const std::string msg = e.what();
    EXPECT_LT(Clock::now() - start, 10s);
    EXPECT_NE(msg.find("rank " + std::to_string(victim)), std::string::npos) << msg;
  }
  expect_refuses_at_once(b);
  if (rank == 0) ::kill(std::stoi(store->get_string("victim_pid")), SIGKILL);
}

ProcessOptions fault_options() {
  ProcessOptions options;
  options.env["TDIST_GLOO_TEST_STORE"] = make_temp_dir("gloo-fault") + "/store";
  options.timeout = 60s;
  return options;
}

void expect_survivors_ok(const std::vector<RankResult>& results, int victim) {
  for (const auto& r : results) {
    if (r.rank == victim) {
      EXPECT_EQ(r.signal, SIGKILL) << "victim output:\n" << r.output;
    } else {
      EXPECT_TRUE(r.ok()) << "rank " << r.rank << " exit " << r.exit_code << " signal " << r.signal
                          << "\n"
                          << r.output;
    }
  }
}

TEST(GlooFault, SigkilledPeerRaisesNetworkErrorNamingIt) {
  for (int world : {2, 3}) {
    auto options = fault_options();
    options.env["VICTIM"] = "1";
    expect_survivors_ok(run_ranks_as_processes("gloo_sigkill_mid_all_reduce", world, options), 1);
  }
}

TEST(GlooFault, SigkilledPeerInASymmetricAllReduceRaisesNetworkError) {
  for (int world : {2, 3}) {
    auto options = fault_options();
    options.env["VICTIM"] = "1";
    options.env["SYMMETRIC"] = "1";
    expect_survivors_ok(run_ranks_as_processes("gloo_sigkill_mid_all_reduce", world, options), 1);
  }
}

TEST(GlooFault, TheStoreHostDyingFailsTheSurvivorsPromptly) {
  for (int world : {2, 3}) {
    expect_survivors_ok(run_ranks_as_processes("gloo_store_host_killed", world, fault_options()),
                        0);
  }
}

TEST(GlooFault, SigstoppedPeerRaisesTimeoutError) {
  for (int world : {2, 3}) {
    expect_survivors_ok(run_ranks_as_processes("gloo_sigstop_times_out", world, fault_options()),
                        world - 1);
  }
}

}  // namespace
}  // namespace tdist::testing

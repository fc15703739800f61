// The flight recorder (include/tdist/comm/flight_recorder.h): what one record holds, the
// ring's capacity, labels, the JSON dump; and, with real processes over Gloo, a rank that
// falls behind (skips a collective, or is SIGSTOPped) makes the others time out, dump their
// records and report which rank is behind and before which label; under tdistrun, the
// failure summary ends with that report.

#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "launch/run_process.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/flight_recorder.h"
#include "tdist/error.h"
#include "tdist/store/hash_store.h"

namespace tdist::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

void init_single() {
  init_process_group(InitProcessGroupOptions()
                         .backend("gloo")
                         .store(std::make_shared<HashStore>())
                         .rank(0)
                         .world_size(1)
                         .timeout(10s));
}

std::string label_of_step(int step) {
  return "blocks." + std::to_string(step) + " all_gather";
}

TEST(FlightRecorder, LabelScopesNestAndRestore) {
  EXPECT_EQ(CollectiveLabelScope::current(), "");
  {
    CollectiveLabelScope outer("blocks.1");
    EXPECT_EQ(CollectiveLabelScope::current(), "blocks.1");
    {
      CollectiveLabelScope inner("blocks.1 reduce_scatter");
      EXPECT_EQ(CollectiveLabelScope::current(), "blocks.1 reduce_scatter");
    }
    EXPECT_EQ(CollectiveLabelScope::current(), "blocks.1");
    // Thread-local: another thread sees no label.
    std::string seen = "unset";
    std::thread([&] { seen = CollectiveLabelScope::current(); }).join();
    EXPECT_EQ(seen, "");
  }
  EXPECT_EQ(CollectiveLabelScope::current(), "");
}

TEST(FlightRecorder, RecordsEveryCollectiveWithLabelShapesAndState) {
  flight_recorder_clear();
  flight_recorder_set_capacity(256);
  init_single();
  at::Tensor t = torch::ones({2, 3});
  {
    CollectiveLabelScope scope("layers.0 all_reduce");
    all_reduce(t);
  }
  at::Tensor out = torch::zeros({4}, torch::kLong);
  all_gather_into_tensor(out, torch::arange(4, torch::kLong));
  barrier();
  auto records = flight_recorder_records();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].op, "all_reduce");
  EXPECT_EQ(records[0].label, "layers.0 all_reduce");
  EXPECT_EQ(records[0].group, "0");
  EXPECT_EQ(records[0].group_ranks, std::vector<int>{0});
  EXPECT_EQ(records[0].rank, 0);
  ASSERT_EQ(records[0].shapes.size(), 1u);
  EXPECT_EQ(records[0].shapes[0], (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(records[0].dtypes, std::vector<std::string>{"Float"});
  EXPECT_EQ(records[1].op, "all_gather_into_tensor");
  EXPECT_EQ(records[1].label, "");
  EXPECT_EQ(records[1].dtypes, std::vector<std::string>{"Long"});
  EXPECT_EQ(records[2].op, "barrier");
  EXPECT_TRUE(records[2].shapes.empty());
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i].state, CollectiveState::kCompleted) << records[i].op;
    EXPECT_GT(records[i].finished_us, 0);
    EXPECT_GE(records[i].finished_us, records[i].issued_us);
    if (i > 0) {
      EXPECT_EQ(records[i].seq, records[i - 1].seq + 1);
      EXPECT_GT(records[i].id, records[i - 1].id);
    }
  }
  auto dump = nlohmann::json::parse(flight_recorder_dump());
  ASSERT_EQ(dump["records"].size(), 3u);
  EXPECT_EQ(dump["records"][0]["label"], "layers.0 all_reduce");
  EXPECT_EQ(dump["records"][0]["state"], "completed");
  EXPECT_EQ(dump["records"][0]["shapes"][0][1], 3);
  EXPECT_EQ(dump["rank"], 0);
  destroy_process_group();
}

TEST(FlightRecorder, KeepsOnlyTheLastNAndZeroTurnsItOff) {
  flight_recorder_clear();
  flight_recorder_set_capacity(4);
  init_single();
  at::Tensor t = torch::ones({1});
  for (int i = 0; i < 10; ++i) {
    CollectiveLabelScope scope(label_of_step(i));
    all_reduce(t);
  }
  auto records = flight_recorder_records();
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records.front().label, label_of_step(6));
  EXPECT_EQ(records.back().label, label_of_step(9));
  flight_recorder_set_capacity(2);
  EXPECT_EQ(flight_recorder_records().size(), 2u);
  flight_recorder_set_capacity(0);
  EXPECT_EQ(flight_recorder_capacity(), 0u);
  EXPECT_TRUE(flight_recorder_records().empty());
  all_reduce(t);
  EXPECT_TRUE(flight_recorder_records().empty());
  destroy_process_group();
  flight_recorder_set_capacity(256);
}

TDIST_SCENARIO(fr_capacity_from_env) {
  if (flight_recorder_capacity() != 7u) {
    throw std::runtime_error("capacity " + std::to_string(flight_recorder_capacity()) +
                             " != TDIST_FLIGHT_RECORDER_SIZE=7");
  }
}

TDIST_SCENARIO(fr_default_capacity) {
  if (flight_recorder_capacity() != 256u) {
    throw std::runtime_error("default capacity " + std::to_string(flight_recorder_capacity()));
  }
}

TEST(FlightRecorder, CapacityComesFromTheEnvironment) {
  ProcessOptions options;
  options.env["TDIST_FLIGHT_RECORDER_SIZE"] = "7";
  expect_all_ok(run_ranks_as_processes("fr_capacity_from_env", 1, options));
  ProcessOptions plain;
  plain.env["TDIST_FLIGHT_RECORDER_SIZE"] = "";
  expect_all_ok(run_ranks_as_processes("fr_default_capacity", 1, plain));
}

// Every rank runs "steps" of one all_reduce each, labelled as FSDP would. The victim (the
// last rank) falls behind before step 3: LAG_MODE=skip sleeps past the others' timeout
// (busy outside collectives), LAG_MODE=sigstop freezes. The others time out.
constexpr int kLagStep = 3;
constexpr auto kTimeout = 1500ms;

TDIST_SCENARIO(fr_lagging_rank) {
  const int rank = env_int("RANK", -1), world = env_int("WORLD_SIZE", -1);
  const int victim = world - 1;
  const std::string mode = std::getenv("LAG_MODE");
  const std::string dir = std::getenv("TDIST_FLIGHT_RECORDER_DIR");
  // Under tdistrun the error leaves the program, as it would a user's training job.
  const bool rethrow = std::getenv("LAG_RETHROW") != nullptr;
  init_process_group(InitProcessGroupOptions().backend("gloo").timeout(kTimeout));
  try {
    for (int step = 0; step < 5; ++step) {
      CollectiveLabelScope scope(label_of_step(step));
      if (rank == victim && step == kLagStep) {
        if (mode == "sigstop") {
          std::ofstream(dir + "/victim.pid") << ::getpid() << "\n";
          ::raise(SIGSTOP);
          std::this_thread::sleep_for(60s);  // never reached: rank 0 kills us
        }
        // Busy elsewhere until the others have timed out and reported.
        std::this_thread::sleep_for(kTimeout * 2 + 2s);
      }
      at::Tensor t = torch::full({8}, rank + 1.0);
      all_reduce(t);
      EXPECT_TRUE(torch::equal(t, torch::full({8}, world * (world + 1) / 2.0)));
    }
    ADD_FAILURE() << "rank " << rank << ": every collective completed despite the lagging rank";
  } catch (const TimeoutError& e) {
    if (rethrow) throw;
    std::cout << "rank " << rank << " caught TimeoutError: " << e.what() << std::endl;
  } catch (const Error& e) {
    std::cout << "rank " << rank << " caught: " << e.what() << std::endl;
  }
  if (rank == 0 && mode == "sigstop") {
    std::ifstream in(dir + "/victim.pid");
    int pid = 0;
    in >> pid;
    if (pid > 0) ::kill(pid, SIGKILL);
  }
  try {
    destroy_process_group();
  } catch (const Error&) {
    // The group is broken; exiting is all that is left.
  }
}

nlohmann::json read_dump(const std::string& dir, int rank) {
  std::ifstream in(dir + "/tdist_flight_recorder_rank" + std::to_string(rank) + ".json");
  if (!in) return nullptr;
  return nlohmann::json::parse(in, nullptr, false);
}

void run_lagging(int world, const std::string& mode) {
  SCOPED_TRACE("world " + std::to_string(world) + ", " + mode);
  const int victim = world - 1;
  const std::string dir = make_temp_dir("flight-recorder");
  ProcessOptions options;
  options.env["LAG_MODE"] = mode;
  options.env["TDIST_FLIGHT_RECORDER_DIR"] = dir;
  options.timeout = 60s;
  auto results = run_ranks_as_processes("fr_lagging_rank", world, options);
  const std::string behind = "rank " + std::to_string(victim) + " is behind";
  const std::string stuck = "stuck before";
  const std::string label = "'" + label_of_step(kLagStep) + "'";
  int reports = 0;
  for (const auto& r : results) {
    if (r.rank == victim) {
      if (mode == "sigstop") {
        EXPECT_EQ(r.signal, SIGKILL) << r.output;
      } else {
        EXPECT_TRUE(r.ok()) << r.output;
      }
      continue;
    }
    EXPECT_TRUE(r.ok()) << "rank " << r.rank << ":\n" << r.output;
    EXPECT_NE(r.output.find("caught"), std::string::npos) << r.output;
    // A rank that was not waiting on the victim may see the first rank's abort (a lost
    // connection) instead of a timeout: it publishes its progress but neither reports nor
    // dumps.
    if (r.output.find("caught TimeoutError") == std::string::npos) continue;
    // The report is printed and appended to the error, and names the victim and the label.
    ++reports;
    EXPECT_NE(r.output.find(behind), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(stuck + " "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(label), std::string::npos) << r.output;
    // It dumped its ring: the steps before the lag completed, the lagging step did not.
    auto dump = read_dump(dir, r.rank);
    ASSERT_TRUE(dump.is_object()) << "rank " << r.rank << " wrote no dump in " << dir;
    std::map<std::string, std::string> state_of;
    for (const auto& rec : dump["records"]) state_of[rec["label"]] = rec["state"];
    for (int step = 0; step < kLagStep; ++step) {
      EXPECT_EQ(state_of[label_of_step(step)], "completed") << dump.dump(1);
    }
    const std::string lag_state = state_of[label_of_step(kLagStep)];
    EXPECT_TRUE(lag_state == "timed out" || lag_state == "failed") << dump.dump(1);
    EXPECT_EQ(state_of.count(label_of_step(kLagStep + 1)), 0u) << dump.dump(1);
    EXPECT_NE(dump["report"].get<std::string>().find(behind), std::string::npos) << dump.dump(1);
  }
  EXPECT_GE(reports, 1) << "no rank timed out (they should have waited for rank " << victim << ")";
}

TEST(FlightRecorder, ReportNamesTheRankThatSkippedACollective) {
  run_lagging(2, "skip");
  run_lagging(3, "skip");
}

TEST(FlightRecorder, ReportNamesAFrozenRank) {
  run_lagging(3, "sigstop");
}

// tdistrun shows a failed rank's last lines: they must be the report that explains the
// timeout, not the tail of the JSON dump, which goes to a file in the log directory.
TEST(FlightRecorder, TdistrunSummaryEndsWithTheReportAndTheDumpIsBesideTheLogs) {
  const std::string logs = make_temp_dir("fr-tdistrun");
  const std::vector<std::string> argv = {launch::testing::tdistrun(),
                                         "--standalone",
                                         "--nproc-per-node",
                                         "3",
                                         "--monitor-interval",
                                         "0.05",
                                         "--stop-timeout",
                                         "3",
                                         "--log-dir",
                                         logs,
                                         "--rdzv-id",
                                         "job",
                                         "--tee",
                                         "3",
                                         TEST_BINARY_PATH};
  auto r = launch::testing::run(argv,
                                {{"TDIST_TEST_SCENARIO", "fr_lagging_rank"},
                                 {"LAG_MODE", "skip"},
                                 {"LAG_RETHROW", "1"},
                                 {"OMP_NUM_THREADS", "1"}},
                                120s);
  const std::string all = "--- stdout\n" + r.out + "--- stderr\n" + r.err;
  ASSERT_NE(r.exit_code, 0) << all;
  const auto at = r.err.find("first failure: rank ");
  ASSERT_NE(at, std::string::npos) << all;
  const std::string summary = r.err.substr(at);
  const int failed = std::atoi(summary.c_str() + std::string("first failure: rank ").size());
  EXPECT_NE(failed, 2) << "the lagging rank is not the one that times out\n" << all;
  EXPECT_NE(summary.find("rank 2 is behind"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("\"state\""), std::string::npos) << summary;
  EXPECT_EQ(r.err.find("\"records\""), std::string::npos) << "the dump went to the console\n"
                                                          << all;
  const std::string dump_dir = logs + "/job/attempt_0";
  auto dump = read_dump(dump_dir, failed);
  ASSERT_TRUE(dump.is_object()) << "rank " << failed << " wrote no dump in " << dump_dir << "\n"
                                << all;
  EXPECT_NE(dump["report"].get<std::string>().find("rank 2 is behind"), std::string::npos);
  EXPECT_NE(all.find("dumped"), std::string::npos) << all;
  EXPECT_NE(all.find(dump_dir + "/tdist_flight_recorder_rank" + std::to_string(failed) + ".json"),
            std::string::npos)
      << all;
}

}  // namespace
}  // namespace tdist::testing

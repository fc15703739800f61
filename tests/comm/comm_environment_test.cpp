// The communication layer's variables are parsed together (CommEnvironment): unset ones keep
// the defaults, set ones are taken, and a malformed one raises naming the variable and its
// value (init_process_group parses them, so a bad value fails the init, not a later failure
// report).
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "comm/comm_environment.h"
#include "support/scoped_env.h"
#include "tdist/error.h"

namespace tdist {
namespace {

using detail::CommEnvironment;
using tdist::testing::ScopedEnv;

TEST(CommEnvironment, DefaultsAndValues) {
  ScopedEnv debug("TDIST_DEBUG", nullptr);
  ScopedEnv torch_debug("TORCH_DISTRIBUTED_DEBUG", nullptr);
  ScopedEnv size("TDIST_FLIGHT_RECORDER_SIZE", nullptr);
  ScopedEnv dir("TDIST_FLIGHT_RECORDER_DIR", nullptr);
  ScopedEnv wait("TDIST_FLIGHT_RECORDER_REPORT_WAIT_MS", nullptr);
  const CommEnvironment defaults = CommEnvironment::from_env();
  EXPECT_FALSE(defaults.debug_detail);
  EXPECT_EQ(defaults.flight_recorder_size, 256u);
  EXPECT_TRUE(defaults.flight_recorder_dir.empty());
  EXPECT_EQ(defaults.report_wait.count(), 2000);

  ScopedEnv detail_level("TORCH_DISTRIBUTED_DEBUG", "detail");
  ScopedEnv seven("TDIST_FLIGHT_RECORDER_SIZE", "7");
  ScopedEnv somewhere("TDIST_FLIGHT_RECORDER_DIR", "/tmp/fr");
  ScopedEnv quick("TDIST_FLIGHT_RECORDER_REPORT_WAIT_MS", "10");
  const CommEnvironment set = CommEnvironment::from_env();
  EXPECT_TRUE(set.debug_detail);
  EXPECT_EQ(set.flight_recorder_size, 7u);
  EXPECT_EQ(set.flight_recorder_dir, "/tmp/fr");
  EXPECT_EQ(set.report_wait.count(), 10);
  ScopedEnv off("TDIST_DEBUG", "OFF");  // TDIST_DEBUG wins over PyTorch's name
  EXPECT_FALSE(CommEnvironment::from_env().debug_detail);
}

TEST(CommEnvironment, MalformedValuesRaiseNamingTheVariable) {
  const std::pair<const char*, const char*> malformed[] = {
      {"TDIST_DEBUG", "VERBOSE"},
      {"TDIST_FLIGHT_RECORDER_SIZE", "lots"},
      {"TDIST_FLIGHT_RECORDER_REPORT_WAIT_MS", "-5"}};
  for (const auto& [name, value] : malformed) {
    tdist::testing::expect_env_value_rejected(name, value, [] { CommEnvironment::from_env(); });
  }
}

}  // namespace
}  // namespace tdist

// Test main: runs a scenario when re-executed as a rank (see ranks.h), else GoogleTest.
#include <gtest/gtest.h>

namespace tdist::testing {
bool run_scenario_if_requested(int* exit_code);
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int exit_code = 0;
  if (tdist::testing::run_scenario_if_requested(&exit_code)) return exit_code;
  return RUN_ALL_TESTS();
}

// Test main: runs a scenario when re-executed as a rank (see ranks.h), else GoogleTest.
#include <gtest/gtest.h>

namespace tdist::testing {
bool run_scenario_if_requested(int* exit_code);
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int exit_code = 0;
  if (tdist::testing::run_scenario_if_requested(&exit_code)) return exit_code;
  const int result = RUN_ALL_TESTS();
  // A binary whose every case skipped (a GPU suite without a GPU) exits 77, which ctest
  // reports as skipped (SKIP_RETURN_CODE in tdist_add_test), never as passed.
  const auto& run = *::testing::UnitTest::GetInstance();
  if (result == 0 && run.skipped_test_count() > 0 && run.successful_test_count() == 0 &&
      run.failed_test_count() == 0) {
    return 77;
  }
  return result;
}

// The error helpers every layer shares live in tdist_util, below the store; they are tested
// here because test_store is the suite that links tdist_util and nothing above it.
#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "tdist/error.h"

namespace {

TEST(MessageOf, ReturnsWhatATdistErrorCarries) {
  auto error = std::make_exception_ptr(tdist::NetworkError("peer 2 closed the connection"));
  EXPECT_EQ(tdist::message_of(error), "peer 2 closed the connection");
}

TEST(MessageOf, ReturnsWhatAStandardExceptionCarries) {
  auto error = std::make_exception_ptr(std::out_of_range("index 7 of 3"));
  EXPECT_EQ(tdist::message_of(error, "fallback"), "index 7 of 3");
}

TEST(MessageOf, FallsBackForANonStandardExceptionAndForNone) {
  EXPECT_EQ(tdist::message_of(std::make_exception_ptr(42)), "unknown error");
  EXPECT_EQ(tdist::message_of(std::make_exception_ptr(42), "connection failed"),
            "connection failed");
  EXPECT_EQ(tdist::message_of(std::exception_ptr(), "aborted"), "aborted");
}

TEST(Stamp, AppendsThePathFromTheSourceRootAndTheLine) {
  try {
    TDIST_THROW(tdist::InvalidArgument, "rank 5 is out of range");
    FAIL() << "TDIST_THROW did not throw";
  } catch (const tdist::InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("rank 5 is out of range [tests/store/error_test.cpp:", 0),
              0u)
        << e.what();
  }
}

TEST(Stamp, ShowsThePathFromTheLastSourceFolderWhereverTheCheckoutIs) {
  using tdist::detail::stamp;
  EXPECT_EQ(stamp("/home/u/src/tdist/src/comm/x.cpp", 7, "m"), "m [src/comm/x.cpp:7]");
  EXPECT_EQ(stamp("/work/tests/tdist/include/tdist/error.h", 3, "m"),
            "m [include/tdist/error.h:3]");
  EXPECT_EQ(stamp("../tests/store/error_test.cpp", 9, "m"), "m [tests/store/error_test.cpp:9]");
  EXPECT_EQ(stamp("/opt/bench/tdist/examples/gpt/trainer.cpp", 4, "m"),
            "m [examples/gpt/trainer.cpp:4]");
  EXPECT_EQ(stamp("elsewhere.cpp", 1, "m"), "m [elsewhere.cpp:1]");
}

}  // namespace

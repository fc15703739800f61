// This program links Debian's libgloo directly, beside LibTorch's own Gloo: the mix that
// Note [One Gloo per symbol scope] (src/gloo/transport/transport.h) forbids. Creating a
// Gloo group must refuse with an error that names the cause, before any Gloo call runs.

#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "comm_gloo/gloo_test_util.h"
#include "tdist/error.h"
#include "tdist/store/hash_store.h"

// A reference into libgloo, so that the linker keeps it as a dependency of this program.
extern "C" void* tdist_test_libgloo_reference() {
  return reinterpret_cast<void*>(&gloo::transport::tcp::CreateDevice);
}

namespace tdist::testing {
namespace {

TEST(GlooScope, ProgramThatLinksLibglooIsRefused) {
  ASSERT_NE(tdist_test_libgloo_reference(), nullptr);
  auto store = std::make_shared<HashStore>();
  try {
    GlooBackend backend(store, 0, 1, std::chrono::seconds(5));
    FAIL() << "a Gloo group was created in a process with two Gloo copies";
  } catch (const DistBackendError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("two Gloo copies would mix"), std::string::npos) << what;
    EXPECT_NE(what.find("libgloo"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace tdist::testing

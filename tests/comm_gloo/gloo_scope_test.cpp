// Note [One Gloo per symbol scope] (src/gloo/transport/transport.h): in a process that
// has LibTorch loaded, tdist's Gloo transport must run on Debian's libgloo and LibTorch's
// `gloo::` symbols must stay LibTorch's own. Mixing the two would corrupt memory silently, so
// these tests look at where each side's Gloo calls actually bind.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "comm_gloo/gloo_test_util.h"
#include "gloo/transport/transport.h"

namespace tdist::testing {
namespace {

TEST(GlooScope, TransportBindsToLibglooAndLibTorchKeepsItsOwn) {
  // A working group first: the module is loaded and has moved data.
  run_gloo(3, [](GlooBackend& backend, int rank, int world) {
    at::Tensor t = torch::full({5}, static_cast<float>(rank + 1));
    backend.all_reduce(t, AllreduceOptions{})->wait();
    EXPECT_TRUE(t.eq(static_cast<float>(world * (world + 1) / 2)).all().item<bool>());
  });
  const std::string own = detail::gloo_transport::module().gloo_library_path();
  const std::string global = detail::gloo_transport::global_gloo_library_path();
  EXPECT_NE(own.find("libgloo.so"), std::string::npos) << "the transport's Gloo is " << own;
  if (global.empty()) {
    GTEST_SKIP() << "this LibTorch carries no Gloo of its own (nothing in the global scope "
                    "defines gloo::transport::tcp::CreateDevice); the transport binds to "
                 << own;
  }
  EXPECT_NE(global.find("libtorch_cpu"), std::string::npos)
      << "the global scope's gloo::transport::tcp::CreateDevice is in " << global;
  EXPECT_NE(own, global);
}

}  // namespace
}  // namespace tdist::testing

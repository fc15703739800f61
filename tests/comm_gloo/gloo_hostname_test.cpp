// Which address Gloo binds when the machine's host name does not resolve (docs/gloo.md
// "Which address gloo binds"): Gloo crashes when handed such a name, so a single-host job
// must run on loopback or the route to the store, and a job across hosts must fail on every
// rank with an error naming the host name and GLOO_SOCKET_IFNAME. The tests move this
// process (and so the ranks it spawns) into fresh UTS and network namespaces, which stay for
// the tests after them in this executable: those need nothing but loopback.

#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>

#include "gloo/device_address.h"
#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::testing {
namespace {

using gloo::GlooBackendOptions;

constexpr const char* kUnresolvable = "tdist-unresolvable-host.invalid";

// Enters a new UTS namespace named `name`; false (with the reason in `why`) when this process
// may not (no CAP_SYS_ADMIN).
bool enter_uts_namespace(const std::string& name, std::string* why) {
  if (unshare(CLONE_NEWUTS) != 0 || sethostname(name.c_str(), name.size()) != 0) {
    *why = std::string("cannot enter a UTS namespace: ") + std::strerror(errno);
    return false;
  }
  return true;
}

// Enters a new network namespace whose only interface is loopback, brought up.
bool enter_loopback_only_network(std::string* why) {
  if (unshare(CLONE_NEWNET) != 0) {
    *why = std::string("cannot enter a network namespace: ") + std::strerror(errno);
    return false;
  }
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ifreq request{};
  std::strncpy(request.ifr_name, "lo", IFNAMSIZ - 1);
  const bool up = fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &request) == 0 &&
                  (request.ifr_flags |= IFF_UP, ioctl(fd, SIOCSIFFLAGS, &request) == 0);
  if (fd >= 0) close(fd);
  if (!up) *why = std::string("cannot bring up loopback: ") + std::strerror(errno);
  return up;
}

#define ENTER_OR_SKIP(call)           \
  do {                                \
    std::string why;                  \
    if (!(call)) GTEST_SKIP() << why; \
  } while (0)

TDIST_SCENARIO(gloo_hostname_all_reduce) {
  init_process_group(InitProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(20)));
  at::Tensor t = torch::full({3}, static_cast<float>(get_rank() + 1));
  all_reduce(t);
  const int n = get_world_size();
  if (!t.eq(static_cast<float>(n * (n + 1) / 2)).all().item<bool>())
    throw std::runtime_error("wrong all_reduce result");
  destroy_process_group();
}

// Ranks meeting through a file store (no MASTER_ADDR to route to), as if on several hosts.
TDIST_SCENARIO(gloo_hostname_expect_clear_error) {
  try {
    init_process_group(InitProcessGroupOptions()
                           .backend("gloo")
                           .init_method(std::getenv("TEST_INIT_METHOD"))
                           .rank(std::atoi(std::getenv("RANK")))
                           .world_size(std::atoi(std::getenv("WORLD_SIZE")))
                           .timeout(std::chrono::seconds(20)));
  } catch (const InvalidArgument& e) {
    std::cout << "caught: " << e.what() << std::endl;
    return;
  }
  throw std::runtime_error("init_process_group succeeded with no usable address");
}

TEST(GlooHostname, SingleHostJobRunsWhenTheHostNameDoesNotResolve) {
  ENTER_OR_SKIP(enter_uts_namespace(kUnresolvable, &why));
  ASSERT_FALSE(detail::bindable_address_of(kUnresolvable).has_value());
  for (int world : {1, 3}) expect_all_ok(run_ranks_as_processes("gloo_hostname_all_reduce", world));
}

TEST(GlooHostname, UnknownPlacementFallsBackToLoopbackWithAWarning) {
  ENTER_OR_SKIP(enter_uts_namespace(kUnresolvable, &why));
  // No store host, placement unknown: what a program that builds GlooBackend itself gets.
  ::testing::internal::CaptureStderr();
  const auto address = detail::choose_device_addresses(GlooBackendOptions(), 1, 0).at(0);
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(address.address, "127.0.0.1");
  EXPECT_NE(warning.find("GLOO_SOCKET_IFNAME"), std::string::npos) << warning;
  EXPECT_NE(warning.find(kUnresolvable), std::string::npos) << warning;
  ProcessOptions options;
  options.env["MASTER_ADDR"] = "localhost";
  options.env["LOCAL_WORLD_SIZE"] = "";  // placement unknown to the ranks
  expect_all_ok(run_ranks_as_processes("gloo_hostname_all_reduce", 2, options));
}

void expect_clear_error_on_every_rank(int world) {
  ProcessOptions options;
  options.env["LOCAL_WORLD_SIZE"] = "1";  // as if each rank were on its own host
  options.env["MASTER_ADDR"] = "";        // nothing to route to
  options.env["TEST_INIT_METHOD"] = "file://" + make_temp_dir("gloo-hostname") + "/store";
  options.timeout = std::chrono::seconds(60);
  const auto results = run_ranks_as_processes("gloo_hostname_expect_clear_error", world, options);
  for (const auto& r : results) {
    EXPECT_TRUE(r.ok()) << "rank " << r.rank << ":\n" << r.output;
    EXPECT_NE(r.output.find(kUnresolvable), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("GLOO_SOCKET_IFNAME"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("several hosts"), std::string::npos) << r.output;
  }
}

TEST(GlooHostname, JobAcrossHostsWithNoUsableAddressFailsOnEveryRank) {
  ENTER_OR_SKIP(enter_uts_namespace(kUnresolvable, &why));
  expect_clear_error_on_every_rank(3);
}

TEST(GlooHostname, StoreOnLoopbackMeansOneHostWhateverLocalWorldSizeSays) {
  // Nodes simulated on one host (HSDP tests do this): MASTER_ADDR=127.0.0.1 can only be
  // reached from this host, so loopback serves every rank.
  ENTER_OR_SKIP(enter_uts_namespace(kUnresolvable, &why));
  ProcessOptions options;
  options.env["LOCAL_WORLD_SIZE"] = "2";
  expect_all_ok(run_ranks_as_processes("gloo_hostname_all_reduce", 4, options));
}

TEST(GlooHostname, LoopbackOnlyNetworkRunsASingleHostJob) {
  ENTER_OR_SKIP(enter_loopback_only_network(&why));
  expect_all_ok(run_ranks_as_processes("gloo_hostname_all_reduce", 2));
  ENTER_OR_SKIP(enter_uts_namespace(kUnresolvable, &why));
  expect_all_ok(run_ranks_as_processes("gloo_hostname_all_reduce", 3));
  expect_clear_error_on_every_rank(2);
}

TEST(GlooDeviceAddress, ExplicitChoicesWin) {
  GlooBackendOptions options;
  options.interfaces({"lo", "eth9"});
  EXPECT_EQ(detail::choose_device_addresses(options, 2, 0).at(1).interface, "eth9");
  EXPECT_EQ(detail::choose_device_addresses(GlooBackendOptions().hostname("127.0.0.1"), 1, 0)
                .at(0)
                .address,
            "127.0.0.1");
  try {
    detail::choose_device_addresses(GlooBackendOptions().hostname(kUnresolvable), 1, 2);
    ADD_FAILURE() << "an unresolvable hostname option was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(kUnresolvable), std::string::npos) << e.what();
  }
}

TEST(GlooDeviceAddress, RouteToTheStoreHost) {
  EXPECT_EQ(detail::local_address_toward("127.0.0.1").value_or("none"), "127.0.0.1");
  EXPECT_FALSE(detail::local_address_toward(kUnresolvable).has_value());
  EXPECT_TRUE(detail::is_loopback("127.0.1.1"));
  EXPECT_TRUE(detail::is_loopback("::1"));
  EXPECT_FALSE(detail::is_loopback("10.1.2.3"));
  const auto chosen = detail::choose_device_addresses(
      GlooBackendOptions().store_host("127.0.0.1").single_host(true), 2, 0);
  ASSERT_EQ(chosen.size(), 2u);
  EXPECT_EQ(chosen.at(0).address, "127.0.0.1");
  EXPECT_EQ(chosen.at(1).address, "127.0.0.1");
}

}  // namespace
}  // namespace tdist::testing

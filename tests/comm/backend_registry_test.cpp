// Backend names, the registry, backend specs, URL parsing, the is_* queries and
// get_node_local_rank.
#include <gtest/gtest.h>

#include "comm/rendezvous.h"
#include "comm/store_backend.h"
#include "support/scoped_env.h"
#include "tdist/comm/backend.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist {
namespace {

using testing::register_store_backend;

CollectiveBackendPtr null_factory(const StorePtr&, int, int, std::chrono::milliseconds) {
  return nullptr;
}

TEST(BackendName, ParsesCaseInsensitively) {
  EXPECT_EQ(Backend("GLOO").str(), "gloo");
  EXPECT_EQ(Backend("Nccl").str(), "nccl");
  EXPECT_EQ(Backend("mpi"), Backend(Backend::MPI));
  EXPECT_EQ(Backend().str(), Backend::UNDEFINED);
}

TEST(BackendName, UnknownNameListsKnownOnes) {
  try {
    Backend("glooo");
    FAIL() << "no error for an unknown backend";
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("unknown backend 'glooo'"), std::string::npos) << what;
    EXPECT_NE(what.find("gloo"), std::string::npos) << what;
    EXPECT_NE(what.find("nccl"), std::string::npos) << what;
  }
}

TEST(BackendRegistry, RegisterAddsNameCapabilityAndRejectsDuplicates) {
  register_store_backend();
  EXPECT_EQ(Backend("StoreTest").str(), "storetest");
  auto list = Backend::backend_list();
  EXPECT_NE(std::find(list.begin(), list.end(), "storetest"), list.end());
  EXPECT_EQ(Backend::backend_capability()["storetest"], std::vector<std::string>{"cpu"});
  EXPECT_THROW(Backend::register_backend("storetest", null_factory), InvalidArgument);
  EXPECT_THROW(Backend::register_backend("bad:name", null_factory), InvalidArgument);
  EXPECT_THROW(Backend::register_backend("nofactory", nullptr), InvalidArgument);
  // A new backend never takes over the cpu default.
  EXPECT_EQ(Backend::default_device_backend_map()["cpu"], "gloo");
}

TEST(BackendRegistry, NewDeviceTypeGetsTheRegisteredDefault) {
  Backend::register_backend("fakeaccel", null_factory, true, {"privateuseone"});
  EXPECT_EQ(get_default_backend_for_device("privateuseone:0"), "fakeaccel");
}

TEST(BackendRegistry, NcclIsReportedUnavailable) {
  EXPECT_FALSE(is_nccl_available());
  try {
    detail::backend_factory("nccl");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not available in this build (no CUDA)"),
              std::string::npos)
        << e.what();
  }
}

TEST(BackendRegistry, IsBackendAvailableChecksEveryNamedBackend) {
  register_store_backend();
  EXPECT_TRUE(is_backend_available("storetest"));
  EXPECT_TRUE(is_backend_available("StoreTest"));
  EXPECT_TRUE(is_backend_available("cpu:storetest"));
  EXPECT_EQ(is_backend_available("gloo"), is_gloo_available());
  EXPECT_EQ(is_backend_available("cpu:storetest,cuda:nccl"), is_nccl_available());
  for (const char* bad : {"nosuch", "", "cpu:", "storetest,", "cpu:storetest,cuda:nosuch"}) {
    EXPECT_FALSE(is_backend_available(bad)) << "'" << bad << "'";
  }
}

TEST(NodeLocalRank, FromLocalRankElseTheFallbackElseAnError) {
  {
    testing::ScopedEnv local_rank("LOCAL_RANK", "3");
    EXPECT_EQ(get_node_local_rank(), 3);
    EXPECT_EQ(get_node_local_rank(7), 3);
  }
  {
    testing::ScopedEnv local_rank("LOCAL_RANK", nullptr);
    EXPECT_EQ(get_node_local_rank(7), 7);
    try {
      get_node_local_rank();
      ADD_FAILURE() << "no LOCAL_RANK and no fallback was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("pass fallback_rank"), std::string::npos) << e.what();
    }
  }
  for (const char* bad : {"-1", "two", "1.5"}) {
    testing::expect_env_value_rejected("LOCAL_RANK", bad, [] { get_node_local_rank(0); });
  }
}

TEST(BackendRegistry, DefaultsPerDevice) {
  EXPECT_EQ(get_default_backend_for_device("cpu"), "gloo");
  EXPECT_EQ(get_default_backend_for_device("cuda:1"), "nccl");
  EXPECT_THROW(get_default_backend_for_device("tpu"), InvalidArgument);
  EXPECT_TRUE(is_available());
  EXPECT_EQ(is_gloo_available(), detail::backend_registered("gloo"));
}

TEST(BackendSpec, ParsesDeviceBackendPairs) {
  register_store_backend();
  auto spec = detail::parse_backend_spec("cpu:gloo,cuda:nccl", "");
  EXPECT_EQ(spec.size(), 2u);
  EXPECT_EQ(spec["cpu"], "gloo");
  EXPECT_EQ(spec["cuda"], "nccl");
  spec = detail::parse_backend_spec(" CPU:StoreTest ", "");
  EXPECT_EQ(spec["cpu"], "storetest");
  spec = detail::parse_backend_spec("storetest", "");
  EXPECT_EQ(spec, (std::map<std::string, std::string>{{"cpu", "storetest"}}));
  EXPECT_THROW(detail::parse_backend_spec("cpu:gloo,cpu:mpi", ""), InvalidArgument);
  EXPECT_THROW(detail::parse_backend_spec("cpu:", ""), InvalidArgument);
  EXPECT_THROW(detail::parse_backend_spec("cpu:bogus", ""), InvalidArgument);
  EXPECT_THROW(detail::parse_backend_spec("", "cuda:0"), InvalidArgument);  // no nccl here
}

TEST(ReduceOpNames, AllNamed) {
  EXPECT_EQ(to_string(ReduceOp::SUM), "SUM");
  EXPECT_EQ(to_string(ReduceOp::AVG), "AVG");
  EXPECT_EQ(to_string(ReduceOp::BXOR), "BXOR");
}

TEST(InitUrl, ParsesEverySchemeAndQuery) {
  auto tcp = detail::parse_init_method("tcp://10.0.0.1:23456?rank=1&world_size=4");
  EXPECT_EQ(tcp.scheme, "tcp");
  EXPECT_EQ(tcp.host, "10.0.0.1");
  EXPECT_EQ(tcp.port, 23456);
  EXPECT_EQ(tcp.query["rank"], "1");
  EXPECT_EQ(tcp.query["world_size"], "4");
  auto file = detail::parse_init_method("file:///tmp/x/y?world_size=2");
  EXPECT_EQ(file.path, "/tmp/x/y");
  EXPECT_EQ(detail::parse_init_method("env://").scheme, "env");
  auto v6 = detail::parse_init_method("tcp://[::1]:80");
  EXPECT_EQ(v6.host, "::1");
  for (const char* bad : {"tcp://host", "tcp://host:99999", "tcp://host:abc", "file://relative",
                          "http://x:1", "nonsense", "env://?rank", "env://?foo=1"}) {
    EXPECT_THROW(detail::parse_init_method(bad), InvalidArgument) << bad;
  }
}

TEST(InitUrl, ParseIntNamesTheVariable) {
  EXPECT_EQ(detail::parse_int("RANK", " 3 ", 0, 10), 3);
  try {
    detail::parse_int("WORLD_SIZE", "two", 1, 100);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("WORLD_SIZE='two' is not an integer"), std::string::npos);
  }
  EXPECT_THROW(detail::parse_int("RANK", "-1", 0, 10), InvalidArgument);
  EXPECT_THROW(detail::parse_int("RANK", "99999999999999999999", 0, 10), InvalidArgument);
  EXPECT_THROW(detail::parse_int("RANK", "", 0, 10), InvalidArgument);
}

TEST(Queries, NotInitialised) {
  EXPECT_FALSE(is_initialized());
  EXPECT_THROW(get_rank(), InvalidArgument);
  EXPECT_THROW(destroy_process_group(), InvalidArgument);
}

}  // namespace
}  // namespace tdist
